"""Dispatch Plane (paper §3.3): route first, then prioritise."""
from __future__ import annotations

from typing import Any, Sequence

from .instance import Instance
from .pcb import InstanceView, ProgramView, Signals
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

    def dispatch(self, view: ProgramView, pid: int, now: float) -> tuple[int, int]:
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
        prio = parse_priority(call_policy(self.scheduling.priority, view, now))
        if self.log is not None:
            self.log.append((now, "scheduling", "priority", view.program_id, view.turn_index, prio))
        return idx, prio
