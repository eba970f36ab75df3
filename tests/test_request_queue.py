"""Waiting queues (simcore/request_queue.py), hand-checked against vLLM's request_queue.py
and the preemption victim rule of vllm/v1/core/sched/scheduler.py."""
from __future__ import annotations

import pytest

from simcore.hooks import Decision
from simcore.policies.base import RetentionKind
from simcore.request import Request
from simcore.request_queue import (
    DeferredPriorityRequestQueue,
    FCFSRequestQueue,
    PriorityRequestQueue,
    create_request_queue,
)


def _req(rid: int, prio: int | None, arrival: float) -> Request:
    return Request(rid=rid, pid=rid, turn=0, prompt=10, output=5, shared=0, priority=prio,
                   arrival=arrival, instance=0)


def test_fcfs_queue_is_release_order_with_preempted_requests_in_front():
    q = create_request_queue("fcfs")
    assert isinstance(q, FCFSRequestQueue)
    a, b, c, d = (_req(i, 0, float(i)) for i in range(4))
    for r in (a, b):
        q.add_request(r)
    q.prepend_request(c)               # preempted: FCFSRequestQueue.prepend_request -> appendleft
    q.prepend_request(d)               # a later preemption goes in front of it
    assert [r.rid for r in q] == [3, 2, 0, 1] and q.peek_request() is d and len(q) == 4
    assert q.pop_request() is d
    assert q.preemption_victim([a, b, c]) is c          # the last running request


def test_priority_queue_orders_by_priority_then_arrival_then_id():
    q = create_request_queue("priority")
    assert isinstance(q, PriorityRequestQueue)
    reqs = [_req(0, 2, 0.0), _req(1, 1, 5.0), _req(2, 1, 3.0), _req(3, 1, 3.0)]
    for r in reqs:
        q.add_request(r)
    assert [r.rid for r in q] == [2, 3, 1, 0]           # vLLM's Request.__lt__
    assert [q.pop_request().rid for _ in range(4)] == [2, 3, 1, 0]
    # victim: largest (priority, arrival); the first of equals in running order
    x, y, z = _req(7, 4, 1.0), _req(8, 4, 1.0), _req(9, 3, 9.0)
    assert q.preemption_victim([z, x, y]) is x


def test_deferred_queue_asks_for_priorities_only_when_an_order_is_needed():
    asked: list[int] = []
    pending: list[Request] = []

    def resolve() -> None:               # what DeferredPriorities.resolve does: fill every pending priority
        asked.append(len(pending))
        for r in pending:
            r.priority = 10 - r.rid
        pending.clear()

    q = create_request_queue("priority", resolve)
    assert isinstance(q, DeferredPriorityRequestQueue)
    a = _req(0, None, 0.0)
    pending.append(a)
    q.add_request(a)
    assert q.peek_request() is a and asked == []          # alone: first whatever its priority
    b = _req(1, None, 1.0)
    pending.append(b)
    q.add_request(b)
    assert q.peek_request() is b and asked == [2]          # two wait: one batch for both (b: 9 < a: 10)
    assert q.preemption_victim([a, b]) is a and asked == [2]
    c = _req(2, None, 2.0)
    pending.append(c)
    assert q.preemption_victim([a, c]) is a and asked == [2, 1]   # a running request without one


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError):
        create_request_queue("lifo")


def test_retention_kind_and_decision_keep_the_old_forms():
    assert RetentionKind("protect") == "protect" and RetentionKind.EVICT == "evict"
    assert {RetentionKind.RELEASE: 1}["release"] == 1
    d = Decision(1.5, "retention", "on_turn_complete", "p1", 3, (RetentionKind.PROTECT, 4.0, None, "release"))
    assert d == (1.5, "retention", "on_turn_complete", "p1", 3, ("protect", 4.0, None, "release"))
    assert d[1] == "retention" and d[5][0] == "protect" and d[:5] == (1.5, "retention", "on_turn_complete", "p1", 3)
