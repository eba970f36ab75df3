"""Policy interfaces of paper Appendix E.

A policy is a small class. The planes set `self.signals` (system signals s(t)) before
each call and pass a `ProgramView` (the PCB's causal view) as `pcb`.

Retention decisions, returned by `on_turn_complete` / `on_turn_arrival`:
    ("protect", until)                  protect the program's KV until `until` (s)
    ("protect", until, value)           ... with a value for Eq. 5 (higher = keep longer)
    ("protect", until, value, "offload")  ... and offload to host memory when it expires
    "release"                           unprotected: stays cached until reclaimed (LRU)
    "evict"                             drop the KV now
    "offload"                           move the KV to the host-memory tier now
    None / "none"                       no change
A returned `RetentionDecision` (what parse_retention makes of the above) is accepted too.

Optional: a policy with a `simulation_run()` method returning a context manager is run
inside it for each simulate() call (a sandboxed policy pins its worker there).

Optional, scheduling: a policy whose `defers_priority` is true is asked with
`defer_priority(pcb, now)` (same observation, same order, no answer yet) and answers every
deferred call at once in `collect_priorities()` (a list, in call order). The engine asks for
them only when an order is needed (simcore.instance), so a sandboxed policy answers a whole
batch in one round trip; the decisions are those of calling `priority` at each release.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from ..errors import UserError
from ..pcb import InstanceView, ProgramView, Signals

__all__ = ["RetentionPolicy", "SchedulingPolicy", "RoutingPolicy", "RetentionDecision",
           "PolicyError", "parse_retention", "parse_priority", "parse_instance",
           "ProgramView", "Signals", "InstanceView", "AXES", "AXIS_BASES", "AXIS_HOOKS"]

#: The policy axes, defined once (the CLI, the gate, the sandbox and the search use these).
AXES: tuple[str, ...] = ("retention", "scheduling", "routing")
#: The hooks each axis's engine calls.
AXIS_HOOKS: dict[str, tuple[str, ...]] = {"retention": ("on_turn_complete", "on_turn_arrival"),
                                         "scheduling": ("priority",), "routing": ("select",)}

# vLLM carries priority as a Python int; clamp to a range both sides can hold.
PRIORITY_MIN = -(2**62)
PRIORITY_MAX = 2**62


class PolicyError(UserError, ValueError):
    """A policy returned something outside its schema, or raised."""


class _Policy:
    name: ClassVar[str] = ""
    axis: ClassVar[str] = ""
    engine_args: ClassVar[dict[str, Any]] = {}
    signals: Signals

    def __init__(self) -> None:  # noqa: D401 - subclasses may define their own __init__
        pass

    def bind(self, signals: Signals) -> None:
        # object.__setattr__ so that a policy defining __slots__ or properties still works
        object.__setattr__(self, "signals", signals)


class RetentionPolicy(_Policy):
    axis = "retention"

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float) -> Any:
        return "release"

    def on_turn_arrival(self, pcb: ProgramView, now: float) -> Any:
        return None


class SchedulingPolicy(_Policy):
    axis = "scheduling"
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb: ProgramView, now: float) -> int:
        return 0


class RoutingPolicy(_Policy):
    axis = "routing"

    def select(self, pcb: ProgramView, inflight: tuple[InstanceView, ...], now: float) -> int:
        return 0


#: axis -> its base class (the name a policy file subclasses)
AXIS_BASES: dict[str, type] = {"retention": RetentionPolicy, "scheduling": SchedulingPolicy,
                               "routing": RoutingPolicy}


class RetentionKind(StrEnum):
    """What happens to a finished call's KV (paper §3.4); compares equal to its string, so
    policies return plain strings ("protect", ...) and the simulator works with members."""
    RELEASE = "release"    # cached, reclaimed in LRU (or value) order
    PROTECT = "protect"    # pinned until a deadline
    EVICT = "evict"        # dropped now
    OFFLOAD = "offload"    # copied to the host tier, device blocks dropped
    NONE = "none"          # no change


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    kind: RetentionKind
    until: float | None = None
    value: float | None = None
    then: RetentionKind = RetentionKind.RELEASE   # at expiry: RELEASE or OFFLOAD


_NONE = RetentionDecision(RetentionKind.NONE)
_SIMPLE = {k.value: RetentionDecision(k) for k in (RetentionKind.RELEASE, RetentionKind.EVICT, RetentionKind.OFFLOAD)}
_SIMPLE["none"] = _NONE


def _finite(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise PolicyError(f"{what} must be a number, got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v):
        raise PolicyError(f"{what} must be finite, got {v}")
    return v


def parse_retention(obj: Any) -> RetentionDecision:
    """Validate a retention decision against the schema in this module's docstring."""
    if obj is None:
        return _NONE
    if type(obj) is RetentionDecision:  # already parsed (a sandboxed policy's proxy does)
        return obj
    if isinstance(obj, str):
        d = _SIMPLE.get(obj)
        if d is None:
            raise PolicyError(f"unknown retention decision {obj!r} (expected protect/release/evict/offload/none)")
        return d
    if isinstance(obj, (tuple, list)) and obj and isinstance(obj[0], str):
        kind = obj[0]
        if kind in _SIMPLE and len(obj) == 1:
            return _SIMPLE[kind]
        if kind == "protect" and 2 <= len(obj) <= 4:
            until = _finite(obj[1], "protect deadline")
            value = None if len(obj) < 3 or obj[2] is None else _finite(obj[2], "protect value")
            then = RetentionKind.RELEASE
            if len(obj) == 4:
                if obj[3] not in ("release", "offload"):
                    raise PolicyError(f"protect expiry action must be 'release' or 'offload', got {obj[3]!r}")
                then = RetentionKind(obj[3])
            return RetentionDecision(RetentionKind.PROTECT, until, value, then)
    raise PolicyError(f"malformed retention decision {obj!r}")


def parse_priority(obj: Any) -> int:
    if isinstance(obj, bool):
        raise PolicyError("priority must be an int, got bool")
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise PolicyError(f"priority must be finite, got {obj}")
        obj = int(round(obj))
    if not isinstance(obj, int):
        raise PolicyError(f"priority must be an int, got {type(obj).__name__}")
    return min(PRIORITY_MAX, max(PRIORITY_MIN, obj))


def parse_instance(obj: Any, n: int) -> int:
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise PolicyError(f"routing must return an instance index (int), got {type(obj).__name__}")
    if not 0 <= obj < n:
        raise PolicyError(f"routing returned instance {obj}, valid range is 0..{n - 1}")
    return obj
