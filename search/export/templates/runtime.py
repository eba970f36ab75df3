"""Runtime shim: lets the exported policy file run unchanged outside the simulator.

It defines what the simulator injects into a policy file's globals (the base classes and
`math`) and the views the policy reads (`ProgramView`, `InstanceView`, `Signals`: generated
at export time from AgentServeSim's simcore/pcb.py, so the fields and their meaning are the
simulator's), plus the decision checks. No dependencies.

The policy runs in this process with full Python rights: AgentServeSim admitted it in its
sandbox (see metadata.json: "admission", "policy_sha256"), but once exported it is your code.
"""
from __future__ import annotations

import hashlib
import math
import types
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

# vLLM carries priority as a Python int; clamp to a range both sides can hold.
PRIORITY_MIN, PRIORITY_MAX = -(2**62), 2**62


class PolicyError(ValueError):
    """A policy returned something outside its schema, or raised."""


# {{SCHEMA}}


PROGRAM_VIEW_FIELDS = tuple(f.name for f in fields(ProgramView))


class _Policy:
    name: ClassVar[str] = ""
    axis: ClassVar[str] = ""
    engine_args: ClassVar[dict[str, Any]] = {}
    signals: Signals

    def bind(self, signals: Signals) -> None:
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


BASES = {"retention": RetentionPolicy, "scheduling": SchedulingPolicy, "routing": RoutingPolicy}


def load_policy(path: str | Path, axis: str, sha256: str | None = None) -> Any:
    """Execute the policy file with the globals the simulator gives it; return an instance.

    This runs the file in the calling process (client, router or vLLM's engine core) with
    full Python rights: it is the deployment the user chose. `sha256` is the exported
    file's hash (metadata.json); a file that no longer matches it is loaded with a warning,
    since what runs is then not what AgentServeSim admitted and measured.
    """
    p = Path(path)
    data = p.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        warnings.warn(f"{p}: differs from the exported candidate (sha256 in metadata.json): it is not the "
                      "code AgentServeSim admitted and measured", RuntimeWarning, stacklevel=2)
    mod = types.ModuleType("exported_policy")
    mod.__dict__.update({"RetentionPolicy": RetentionPolicy, "SchedulingPolicy": SchedulingPolicy,
                         "RoutingPolicy": RoutingPolicy, "math": math})
    exec(compile(data.decode("utf-8"), str(p), "exec"), mod.__dict__)  # noqa: S102
    base = BASES[axis]
    found = [v for v in mod.__dict__.values() if isinstance(v, type) and issubclass(v, base) and v is not base]
    if not found:
        raise PolicyError(f"{p}: defines no subclass of {base.__name__}")
    return found[-1]()


def call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except PolicyError:
        raise
    except Exception as e:  # noqa: BLE001 - the policy is foreign code: report in one line
        raise PolicyError(f"{fn.__qualname__} raised {type(e).__name__}: {e}") from None


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


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    kind: str                    # protect | release | evict | offload | none
    until: float | None = None
    value: float | None = None
    then: str = "release"


def _num(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        raise PolicyError(f"{what} must be a finite number, got {x!r}")
    return float(x)


def parse_retention(obj: Any) -> RetentionDecision:
    if obj is None:
        return RetentionDecision("none")
    if isinstance(obj, (tuple, list)) and len(obj) == 1:
        obj = obj[0]
    if isinstance(obj, str):
        if obj not in ("release", "evict", "offload", "none"):
            raise PolicyError(f"unknown retention decision {obj!r}")
        return RetentionDecision(obj)
    if isinstance(obj, (tuple, list)) and obj and obj[0] == "protect" and 2 <= len(obj) <= 4:
        value = None if len(obj) < 3 or obj[2] is None else _num(obj[2], "protect value")
        then = obj[3] if len(obj) == 4 else "release"
        if then not in ("release", "offload"):
            raise PolicyError(f"protect expiry action must be 'release' or 'offload', got {then!r}")
        return RetentionDecision("protect", _num(obj[1], "protect deadline"), value, then)
    raise PolicyError(f"malformed retention decision {obj!r}")


def parse_instance(obj: Any, n: int) -> int:
    if isinstance(obj, bool) or not isinstance(obj, int) or not 0 <= obj < n:
        raise PolicyError(f"routing must return an instance index in 0..{n - 1}, got {obj!r}")
    return obj
