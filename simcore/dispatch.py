"""Dispatch Plane (paper §3.3): route first, then prioritise."""
from __future__ import annotations

from typing import Any, Sequence

from .hooks import Decision, call_policy, instance_views, signals
from .instance import Instance
from .pcb import ProgramView
from .policies.base import PolicyError, parse_instance, parse_priority
from .request import Request


class DeferredPriorities:
    """Priorities a scheduling policy answers in batches (policies/base.py, `defers_priority`):
    the calls asked so far, answered together when an instance's waiting queue first needs
    an order (request_queue.DeferredPriorityRequestQueue calls `resolve`)."""

    def __init__(self, policy: Any, log: list | None) -> None:
        self.policy = policy
        self.log = log
        self._pending: list[tuple[Request, int]] = []

    def defer(self, req: Request, slot: int) -> None:
        """`req` waits for its priority; `slot` is its entry in the decision log (-1: none)."""
        self._pending.append((req, slot))

    def resolve(self) -> None:
        """Collect every deferred priority (one batch)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        raws = call_policy(self.policy.collect_priorities)
        if len(raws) != len(pending):
            raise PolicyError(f"collect_priorities returned {len(raws)} priorities for {len(pending)} calls")
        log = self.log
        for (req, slot), raw in zip(pending, raws):
            req.priority = prio = parse_priority(raw)
            if log is not None:
                log[slot] = log[slot]._replace(value=prio)


class DispatchPlane:
    def __init__(self, routing: Any, scheduling: Any, instances: Sequence[Instance], log: list | None,
                 deferred: DeferredPriorities | None = None) -> None:
        self.routing = routing
        self.scheduling = scheduling
        self.instances = instances
        self.log = log
        self.deferred = deferred

    def dispatch(self, view: ProgramView, pid: int, now: float) -> tuple[int, int | None]:
        """Route, then prioritise: (instance, priority); priority None when deferred (see defer())."""
        inst = self.instances
        views = instance_views(inst, pid)
        if len(inst) > 1:
            self.routing.bind(signals(views, now))
            idx = parse_instance(call_policy(self.routing.select, view, views, now), len(inst))
            if self.log is not None:
                self.log.append(Decision(now, "routing", "select", view.program_id, view.turn_index, idx))
        else:
            idx = 0
        self.scheduling.bind(signals(views, now, idx))
        if self.deferred is not None:  # asked now, answered when the engine first needs an order
            call_policy(self.scheduling.defer_priority, view, now)
            prio = None
        else:
            prio = parse_priority(call_policy(self.scheduling.priority, view, now))
        self._slot = -1
        if self.log is not None:
            self._slot = len(self.log)
            self.log.append(Decision(now, "scheduling", "priority", view.program_id, view.turn_index, prio))
        return idx, prio

    def defer(self, req: Request) -> None:
        """`req` (just dispatched, priority None) waits for its deferred priority."""
        assert self.deferred is not None
        self.deferred.defer(req, self._slot)

    def resolve_priorities(self) -> None:
        """Collect every deferred priority still pending (the decision log gets them all)."""
        if self.deferred is not None:
            self.deferred.resolve()
