"""Policy objects whose hooks run in a worker: what the simulator holds instead of the candidate.

Each is an instance of the axis's base class, so the simulator calls it like an in-process
policy. Every answer comes from the worker -- nothing is answered on the candidate's behalf
-- and is validated with the simulator's own parse_* functions before the engine sees it.
"""
from __future__ import annotations

from typing import Any

from simcore.policies.base import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    RetentionDecision,
    RetentionKind,
    RetentionPolicy,
    RoutingPolicy,
    SchedulingPolicy,
    parse_instance,
    parse_priority,
    parse_retention,
)

from .process import WorkerProcess


class _Proxy:
    """Mixin: holds the worker; `signals` is set by the simulator through bind()."""
    _worker: WorkerProcess

    @property
    def sandbox(self) -> WorkerProcess:
        """The worker process (pid, layers, layout, calls, frames, wire, alive, ...)."""
        return self._worker

    @property
    def sandbox_layers(self) -> dict[str, str]:
        """{layer: "on ..." | "off: why"} as reported before the candidate loaded and checked
        from outside where /proc shows it (sandbox/process.py verify_layers)."""
        return self._worker.layers

    @property
    def sandbox_layout(self) -> str:
        """"mirrored" (the worker maps the interpreter at this process's address) or "off: why"."""
        return self._worker.layout

    def close(self) -> None:
        self._worker.close()

    def simulation_run(self) -> Any:
        """Entered by simulate() around a run (see WorkerProcess.session)."""
        return self._worker.session()

    def flush(self) -> None:
        """Run every deferred call now; raises SandboxViolation on a failure."""
        self._worker.flush()

    def _sig(self) -> Any:
        return self.__dict__.get("signals")


class SandboxedRetention(_Proxy, RetentionPolicy):
    def on_turn_complete(self, pcb: Any, request_id: str, now: float) -> Any:
        raw = self._worker.call("c", now, pcb, str(request_id), self.__dict__.get("signals"))
        # the common answers, as parse_retention would take them (a finite float deadline)
        if type(raw) is list and len(raw) == 2 and raw[0] == "protect" and type(raw[1]) is float \
                and raw[1] - raw[1] == 0.0:
            return RetentionDecision(RetentionKind.PROTECT, raw[1])
        d = _SIMPLE_DECISIONS.get(raw) if type(raw) is str else None
        if d is not None:
            return d
        return _retention(raw, self._worker, "on_turn_complete")

    def on_turn_arrival(self, pcb: Any, now: float) -> Any:
        raw = self._worker.call("a", now, pcb, None, self.__dict__.get("signals"))
        d = _SIMPLE_DECISIONS.get(raw) if type(raw) is str else None
        if d is not None:
            return d
        return _retention(raw, self._worker, "on_turn_arrival")


_SIMPLE_DECISIONS = {k: parse_retention(k) for k in ("release", "evict", "offload", "none")}


class SandboxedScheduling(_Proxy, SchedulingPolicy):
    # Deferred priorities (simcore/policies/base.py): the engine asks for an order only when
    # it needs one, and every priority queued by then comes back in one round trip. Each is
    # still computed by the worker, on the view of its own moment.
    defers_priority = False  # set by load_sandboxed_policy

    def priority(self, pcb: Any, now: float) -> int:
        return self._priority(self._worker.call("p", now, pcb, None, self.__dict__.get("signals")))

    def defer_priority(self, pcb: Any, now: float) -> None:
        self._worker.queue("p", now, pcb, None, self.__dict__.get("signals"))

    def collect_priorities(self) -> list[int]:
        return [self._priority(raw) for raw in self._worker.collect()]

    def _priority(self, raw: Any) -> int:
        if type(raw) is int and PRIORITY_MIN <= raw <= PRIORITY_MAX:
            return raw  # what parse_priority would return, without the call
        try:
            return parse_priority(raw)
        except Exception as e:  # noqa: BLE001 - PolicyError and anything odd in the value
            self._worker._fail(f"priority: {e}")


class SandboxedRouting(_Proxy, RoutingPolicy):
    def select(self, pcb: Any, inflight: tuple, now: float) -> int:
        w = self._worker
        raw = w.call("s", now, pcb, [w.enc.instance(v) for v in inflight], self._sig())
        try:
            return parse_instance(raw, len(inflight))
        except Exception as e:  # noqa: BLE001
            self._worker._fail(f"select: {e}")


def _retention(raw: Any, worker: WorkerProcess, hook: str) -> Any:
    try:
        return parse_retention(tuple(raw) if isinstance(raw, list) else raw)
    except Exception as e:  # noqa: BLE001
        worker._fail(f"{hook}: {e}")


PROXIES = {"retention": SandboxedRetention, "scheduling": SandboxedScheduling, "routing": SandboxedRouting}
