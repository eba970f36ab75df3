"""Making OpenEvolve 0.4.0 reproducible from a run seed (needed for exact resume).

OpenEvolve draws parents and inspirations from the global `random` module (which other
libraries in the process may also touch), names programs with `uuid.uuid4()` (os.urandom),
and iterates Python sets of those names. For a run to be a function of its seed we give
its database and prompt sampler a private `random.Random`, give it counter-based ids, and
run the driver with PYTHONHASHSEED=0 (see `search.cli`). The patches are module attribute
swaps, undone on exit.
"""
from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator


class CountingUUID:
    """Stand-in for the `uuid` module inside OpenEvolve: ids from (seed, counter)."""

    UUID = uuid.UUID

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._n = 0
        self._lock = threading.Lock()

    def uuid4(self) -> uuid.UUID:
        with self._lock:
            self._n += 1
            n = self._n
        digest = hashlib.sha256(f"agentservesim:{self._seed}:{n}".encode()).digest()
        return uuid.UUID(bytes=digest[:16], version=4)

    def __getattr__(self, name: str) -> Any:   # anything else: the real module
        return getattr(uuid, name)


@contextlib.contextmanager
def seeded_openevolve(seed: int, controller_cls: type | None = None) -> Iterator[None]:
    import openevolve.controller as oe_controller
    import openevolve.database as oe_database
    import openevolve.prompt.sampler as oe_sampler
    ids = CountingUUID(seed)
    swaps = [(oe_database, "random", random.Random(seed)),
             (oe_sampler, "random", random.Random(seed + 1)),
             (oe_database, "uuid", ids), (oe_controller, "uuid", ids)]
    if controller_cls is not None:
        swaps.append((oe_controller, "ProcessParallelController", controller_cls))
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in swaps]
    for mod, name, value in swaps:
        setattr(mod, name, value)
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


class OrderedExecutor:
    """Runs jobs on threads but completes their futures in submission order.

    OpenEvolve's loop handles whichever result is done first; with several evaluations in
    flight that order (and so the database's history) would depend on timing. Releasing
    results in submission order makes the run a function of its seed at any parallelism.
    """

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="search-job")
        self._queue: deque[tuple[Future, Future]] = deque()
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        outer: Future = Future()
        inner = self._pool.submit(fn, *args, **kwargs)
        with self._lock:
            self._queue.append((inner, outer))
        inner.add_done_callback(lambda _f: self._drain())
        return outer

    def _drain(self) -> None:
        with self._lock:
            while self._queue and self._queue[0][0].done():
                inner, outer = self._queue.popleft()
                if outer.cancelled():
                    continue
                exc = inner.exception() if not inner.cancelled() else RuntimeError("job cancelled")
                if exc is not None:
                    outer.set_exception(exc)
                else:
                    outer.set_result(inner.result())

    def shutdown(self, wait: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)
        with self._lock:
            for _inner, outer in self._queue:
                outer.cancel()
            self._queue.clear()
