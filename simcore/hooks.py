"""What the Dispatch and Retention planes share when they call a policy hook: the system
signals a policy sees, the one-line error for a hook that raises, and the decision-log record."""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from .instance import Instance
from .pcb import InstanceView, Signals
from .policies.base import PolicyError


class Decision(NamedTuple):
    """One policy decision, as the decision log (`simulate(decision_log=...)`) records it.
    A tuple, so logs compare and index positionally."""
    time: float
    axis: str            # "routing" | "scheduling" | "retention"
    hook: str            # "select" | "priority" | "on_turn_complete" | "on_turn_arrival"
    program_id: str
    turn: int
    value: Any           # instance index, priority, or (RetentionKind, until, value, then)


def instance_views(instances: Sequence[Instance], pid: int) -> tuple[InstanceView, ...]:
    return tuple(InstanceView(index=i.index, running=len(i.running), waiting=i.num_waiting,
                              kv_utilization=i.kv.usage(), free_tokens=i.kv.num_free * i.block_size,
                              holds_program_kv=i.kv.cached_blocks(pid) > 0)
                 for i in instances)


def signals(views: tuple[InstanceView, ...], now: float, kv_of: int | None = None) -> Signals:
    """s(t) for a decision about instance `kv_of` (its KV utilisation), if any."""
    return Signals(now=now, kv_utilization=views[kv_of].kv_utilization if kv_of is not None else None,
                   instances=views)


def call_policy(fn: Any, *args: Any) -> Any:
    """Run a policy hook; any exception becomes a one-line PolicyError."""
    try:
        return fn(*args)
    except PolicyError:
        raise
    except Exception as e:  # noqa: BLE001 - policy code is foreign; report, don't crash
        raise PolicyError(f"{type(fn.__self__).__name__}.{fn.__name__} raised {type(e).__name__}: {e}") from None
