"""Load a candidate policy into a sandboxed worker: `load_sandboxed_policy(source, axis)`.

The one entry point the simulator side uses (evolve simulate, evolve check, the evaluator,
evolve plot). It runs the static gate, starts an isolated worker (sandbox/process.py) and
returns a proxy of the axis's base class (sandbox/proxies.py) whose hooks run there. Any
failure raises `SandboxViolation` (a `PolicyError`) with a one-line reason; a machine that
lacks an isolation layer raises `SandboxUnavailable` unless weak sandboxes are allowed.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from simcore.config import EngineArgs

from . import wire
from .errors import SandboxUnavailable, SandboxViolation
from .gate import check_source
from .process import (DEFAULT_CPU_BUDGET_S, DEFAULT_DECISION_TIMEOUT_S, DEFAULT_MEMORY_MB, LOAD_TIMEOUT_S,
                      WorkerProcess)
from .proxies import PROXIES
from .wire import ViewEncoder

__all__ = ["load_sandboxed_policy", "SandboxViolation", "SandboxUnavailable", "WorkerProcess", "ViewEncoder",
           "DEFAULT_CPU_BUDGET_S", "DEFAULT_DECISION_TIMEOUT_S", "DEFAULT_MEMORY_MB", "LOAD_TIMEOUT_S"]


def _engine_args(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SandboxViolation("engine_args must be a dict")
    try:
        EngineArgs(**raw)
    except (ValidationError, TypeError, RecursionError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": type(e).__name__}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise SandboxViolation(f"engine_args{('.' + loc) if loc else ''}: {first.get('msg')}") from None
    return dict(raw)


def load_sandboxed_policy(source: str, axis: str, *, decision_timeout_s: float = DEFAULT_DECISION_TIMEOUT_S,
                          cpu_budget_s: float = DEFAULT_CPU_BUDGET_S, memory_mb: int = DEFAULT_MEMORY_MB,
                          load_timeout_s: float = LOAD_TIMEOUT_S, allow_weak_sandbox: bool = False,
                          gate: bool = True, seccomp: bool = True, audit: bool = True, defer: bool = True,
                          mirror_layout: bool = False, simulate_unavailable: tuple[str, ...] = (),
                          native_payload: bool = False) -> Any:
    """A policy object of `axis`'s base class whose hooks run in an isolated worker.

    allow_weak_sandbox: run even where an isolation layer is unavailable (otherwise that
      raises SandboxUnavailable); `policy.sandbox_layers` says which are on.
    defer: a scheduling policy's priorities are computed when the engine needs an order
      (simcore/policies/base.py), several per round trip; False: one round trip per call.
    mirror_layout: opt-in speed-up that maps the worker's interpreter at this process's
      address (sandbox/layout.py); it hands the parent's library addresses to the candidate.
    For tests only: gate=False skips the static gate (to show the worker contains what the
    gate refuses), seccomp/audit=False turn one layer off ("off: disabled by the caller"),
    simulate_unavailable names layers to treat as missing, native_payload=True (with
    gate=False) hands the candidate the real `ctypes` module, as the threat model assumes.
    Close the policy with `.close()`; it is also killed when garbage-collected, at
    interpreter exit, and when this process dies.
    """
    if native_payload and gate:
        raise ValueError("native_payload needs gate=False (it is a test of the kernel layers)")
    wire_fields = None  # without the gate nothing bounds what the code reads: send every field
    if gate:
        wire_fields = wire.select_fields(check_source(source, axis).observed_names)
    w = WorkerProcess(source, axis, decision_timeout_s=decision_timeout_s, cpu_budget_s=cpu_budget_s,
                      memory_mb=memory_mb, load_timeout_s=load_timeout_s, seccomp=seccomp, audit=audit,
                      wire_fields=wire_fields, mirror_layout=mirror_layout, allow_weak_sandbox=allow_weak_sandbox,
                      simulate_unavailable=tuple(simulate_unavailable), native_payload=native_payload)
    try:
        ea = _engine_args(w.info.get("engine_args", {}))
    except SandboxViolation:
        w.close()
        raise
    name = w.info.get("name") or w.info.get("class") or "candidate"
    proxy_cls = type(f"Sandboxed_{w.info.get('class') or 'Policy'}", (PROXIES[axis],),
                     {"name": name, "engine_args": ea})
    policy = proxy_cls()
    policy._worker = w
    if axis == "scheduling":
        policy.defers_priority = defer
    return policy
