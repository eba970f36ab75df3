"""Waiting queues of the instance engine, made from the scheduling mode (vLLM's
v1/core/sched/request_queue.py): FCFS, priority, and priority with deferred priorities.

Besides the order of waiting requests, a queue answers the one other question the
scheduling mode decides: which running request a preemption takes
(vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`): the last one under FCFS, the one
with the largest (priority, arrival) under the priority policy.
"""
from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from enum import StrEnum
from typing import Callable, Iterator, Sequence

from .request import Request


class SchedulingPolicy(StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class RequestQueue(ABC):
    """Waiting requests of one instance."""

    @abstractmethod
    def add_request(self, req: Request) -> None: ...

    @abstractmethod
    def peek_request(self) -> Request: ...

    @abstractmethod
    def pop_request(self) -> Request: ...

    @abstractmethod
    def prepend_request(self, req: Request) -> None:
        """A preempted request goes back (to the front under FCFS; by its key otherwise)."""

    @abstractmethod
    def preemption_victim(self, running: Sequence[Request]) -> Request: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The waiting requests in the order they would be admitted."""


class FCFSRequestQueue(deque, RequestQueue):  # type: ignore[type-arg]
    """Release order; preempted requests go back to the front (most recent first).
    A deque itself, as in vLLM, so length and truth tests cost no Python call."""

    add_request = deque.append
    pop_request = deque.popleft
    prepend_request = deque.appendleft

    def peek_request(self) -> Request:
        return self[0]

    def preemption_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    __len__ = deque.__len__
    __iter__ = deque.__iter__


class PriorityRequestQueue(RequestQueue):
    """Heap on (priority, arrival, id): smaller first (vLLM's `Request.__lt__`)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def add_request(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))  # type: ignore[arg-type]

    def peek_request(self) -> Request:
        return self._heap[0][3]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[3]

    prepend_request = add_request

    def preemption_victim(self, running: Sequence[Request]) -> Request:
        return max(running, key=lambda r: (r.priority, r.arrival))  # first of equals, as vLLM

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter([e[3] for e in sorted(self._heap)])


class DeferredPriorityRequestQueue(PriorityRequestQueue):
    """Priority order for a policy that answers priorities in batches (policies/base.py,
    `defers_priority`): a request may be queued before its priority is known. It waits
    unranked until an order is needed -- two or more waiting, or a preemption victim to
    choose -- and then `resolve()` collects every pending priority at once (possibly for
    other instances' requests too). Ranking only when an order is needed gives exactly the
    eager order, because the heap's order is total."""

    def __init__(self, resolve: Callable[[], None]) -> None:
        super().__init__()
        self._resolve = resolve
        self._unranked: list[Request] = []

    def add_request(self, req: Request) -> None:
        if req.priority is None:
            self._unranked.append(req)
        else:
            super().add_request(req)

    prepend_request = add_request

    def _rank(self) -> None:
        if any(r.priority is None for r in self._unranked):
            self._resolve()
        for r in self._unranked:
            super().add_request(r)
        self._unranked.clear()

    def peek_request(self) -> Request:
        if self._unranked:
            if not self._heap and len(self._unranked) == 1:
                return self._unranked[0]  # alone in the queue: first whatever its priority
            self._rank()
        return self._heap[0][3]

    def pop_request(self) -> Request:
        if self._unranked:
            if not self._heap and len(self._unranked) == 1:
                return self._unranked.pop()
            self._rank()
        return super().pop_request()

    def preemption_victim(self, running: Sequence[Request]) -> Request:
        if any(r.priority is None for r in running):
            self._resolve()
        return super().preemption_victim(running)

    def __len__(self) -> int:
        return len(self._heap) + len(self._unranked)

    def __iter__(self) -> Iterator[Request]:
        """Ranked requests in order, then those whose priority is still pending (asking
        for it here would change when the policy is asked)."""
        return iter([e[3] for e in sorted(self._heap)] + self._unranked)


def create_request_queue(policy: str, resolve: Callable[[], None] | None = None) -> RequestQueue:
    """The waiting queue for a scheduling mode; `resolve` (priority mode only) collects
    deferred priorities when the policy answers them in batches."""
    mode = SchedulingPolicy(policy)
    if mode is SchedulingPolicy.FCFS:
        return FCFSRequestQueue()
    return PriorityRequestQueue() if resolve is None else DeferredPriorityRequestQueue(resolve)
