"""Retention Plane (paper §3.4): a value and protection deadline for each completed call's KV.

The policy decides; the instance's KV manager enforces capacity with the Eq. 5 key.
"""
from __future__ import annotations

from typing import Any, Sequence

from .hooks import Decision, call_policy, instance_views, signals
from .instance import Instance
from .pcb import ProgramView
from .policies.base import RetentionDecision, RetentionKind, parse_retention
from .request import Request


class RetentionPlane:
    def __init__(self, policy: Any, instances: Sequence[Instance], log: list | None) -> None:
        self.policy = policy
        self.instances = instances
        self.log = log

    def _decide(self, hook: str, view: ProgramView, pid: int, inst: Instance, now: float,
                *args: Any) -> RetentionDecision:
        self.policy.bind(signals(instance_views(self.instances, pid), now, inst.index))
        d = parse_retention(call_policy(getattr(self.policy, hook), view, *args))
        if self.log is not None:
            self.log.append(Decision(now, "retention", hook, view.program_id, view.turn_index,
                                     (d.kind, d.until, d.value, d.then)))
        return d

    def on_complete(self, view: ProgramView, req: Request, inst: Instance, now: float) -> None:
        """Call completed on `inst`: its blocks go back under the policy's decision."""
        d = self._decide("on_turn_complete", view, req.pid, inst, now, f"{view.program_id}/{req.turn}", now)
        kv = inst.kv
        # "none" and a deadline at or before completion both mean release (KVManager.release).
        kv.release(req.pid, req.num_computed // kv.block_size, req.held, now, d.kind, d.until, d.value, d.then)
        req.held = 0

    def on_arrival(self, view: ProgramView, pid: int, now: float) -> None:
        """The program's next call was released: the policy may release or re-protect its KV."""
        home = self.instances[view.last_instance] if view.last_instance is not None else self.instances[0]
        d = self._decide("on_turn_arrival", view, pid, home, now, now)
        if d.kind is RetentionKind.NONE:
            return
        for inst in self.instances:
            inst.kv.apply(pid, d.kind, now, d.until, d.value, d.then)
