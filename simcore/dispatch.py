"""Dispatch Plane (paper §3.3): route first, then prioritise."""
from __future__ import annotations

from typing import Any, Sequence

from .instance import Instance
from .pcb import InstanceView, ProgramView, Signals
from .request import Request
from .policies.base import PolicyError, parse_instance, parse_priority


def instance_views(instances: Sequence[Instance], pid: int) -> tuple[InstanceView, ...]:
    return tuple(InstanceView(index=i.index, running=len(i.running), waiting=i.num_waiting,
                              kv_utilization=i.kv.usage(), free_tokens=i.kv.num_free * i.block_size,
                              holds_program_kv=i.kv.cached_blocks(pid) > 0)
                 for i in instances)


def call_policy(fn: Any, *args: Any) -> Any:
    """Run a policy hook; any exception becomes a one-line PolicyError."""
    try:
        return fn(*args)
    except PolicyError:
        raise
    except Exception as e:  # noqa: BLE001 - policy code is foreign; report, don't crash
        raise PolicyError(f"{type(fn.__self__).__name__}.{fn.__name__} raised {type(e).__name__}: {e}") from None


class DispatchPlane:
    def __init__(self, routing: Any, scheduling: Any, instances: Sequence[Instance], log: list | None) -> None:
        self.routing = routing
        self.scheduling = scheduling
        self.instances = instances
        self.log = log
        # Priorities a policy answers in batches (policies/base.py: defers_priority): requests
        # queued before their priority is known, with their decision-log slot.
        self.defers = bool(getattr(scheduling, "defers_priority", False))
        self._slot = -1
        self._pending: list[tuple[Request, int]] = []
        for inst in instances:
            inst.resolve_priorities = self.resolve_priorities

    def dispatch(self, view: ProgramView, pid: int, now: float) -> tuple[int, int | None]:
        """Route, then prioritise: (instance, priority); priority None when deferred (see defer())."""
        inst = self.instances
        views = instance_views(inst, pid)
        if len(inst) > 1:
            self.routing.bind(Signals(now=now, kv_utilization=None, instances=views))
            idx = parse_instance(call_policy(self.routing.select, view, views, now), len(inst))
            if self.log is not None:
                self.log.append((now, "routing", "select", view.program_id, view.turn_index, idx))
        else:
            idx = 0
        self.scheduling.bind(Signals(now=now, kv_utilization=views[idx].kv_utilization, instances=views))
        if self.defers:  # asked now, answered when the engine first needs an order
            call_policy(self.scheduling.defer_priority, view, now)
            prio = None
        else:
            prio = parse_priority(call_policy(self.scheduling.priority, view, now))
        if self.log is not None:
            self._slot = len(self.log)
            self.log.append((now, "scheduling", "priority", view.program_id, view.turn_index, prio))
        return idx, prio

    def defer(self, req: Request) -> None:
        """`req` (just dispatched, priority None) waits for its deferred priority."""
        self._pending.append((req, self._slot))

    def resolve_priorities(self) -> None:
        """Collect every deferred priority (one batch) and rank the requests waiting for one."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        raws = call_policy(self.scheduling.collect_priorities)
        if len(raws) != len(pending):
            raise PolicyError(f"collect_priorities returned {len(raws)} priorities for {len(pending)} calls")
        log = self.log
        for (req, slot), raw in zip(pending, raws):
            req.priority = prio = parse_priority(raw)
            if log is not None:
                log[slot] = log[slot][:5] + (prio,)
        for inst in self.instances:
            inst.rank_pending()
