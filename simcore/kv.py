"""Paged KV cache of one instance: block pool, prefix hits, and reclamation order.

Mirrors vLLM v1's `BlockPool` / `KVCacheManager` at the granularity that matters for
agent programs. A program's calls extend one token stream, so the blocks a program has
cached form one run of full blocks (a prefix of that stream): we track that run as one
`KVEntry` instead of thousands of hashed blocks. Equivalences with vLLM:

* Freed blocks keep their hashes and stay hittable until reused (lazy eviction). The free
  queue is LRU by release time, and a request's tail blocks are freed first, so eviction
  eats a program's run from its tail: `entry.blocks -= n`.
* Prefix hits are the longest run of cached full blocks, capped at num_tokens - 1.
* Retention (paper Eq. 5) replaces that order for program KV: unprotected entries are
  reclaimed by value ascending (value defaults to last-access time, i.e. LRU); protected
  entries are pinned out of the free queue and reclaimed only when nothing unprotected is
  left, least value first (value defaults to the deadline).
* Blank blocks (never used, partial tail blocks, dropped KV) sit in the same queue, keyed
  by the time they were freed, exactly like vLLM's unhashed free blocks.

A second, host-memory tier holds offloaded runs (LRU by offload time), reloaded on a hit
at the host link's bandwidth.
"""
from __future__ import annotations

import heapq
import itertools
import math

FREE, PROTECTED, IN_USE, GONE = 0, 1, 2, 3


class KVEntry:
    """The cached run of one program on one instance."""
    __slots__ = ("pid", "blocks", "state", "key", "seq", "until", "value", "then")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.blocks = 0
        self.state = GONE
        self.key = 0.0
        self.seq = 0
        self.until: float | None = None
        self.value: float | None = None
        self.then = "release"


class KVManager:
    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._seq = itertools.count()
        # free queue: (key, seq, entry|None, blank_count); entry None = blank segment
        self._free: list[tuple[float, int, KVEntry | None, int]] = []
        self._prot: list[tuple[float, int, KVEntry]] = []    # protected, by value
        self._expiry: list[tuple[float, int, KVEntry]] = []  # protected, by deadline
        self.num_free = num_blocks          # blank + unprotected cached blocks
        self.num_protected = 0
        self.entries: dict[int, KVEntry] = {}
        self._push_blank(num_blocks, -math.inf)
        self.host_blocks = host_blocks
        self.host: dict[int, int] = {}      # pid -> blocks on host, insertion = LRU order
        self.host_used = 0
        self.evicted_blocks = 0             # cached blocks lost to reclamation (stat)

    # ---------------------------------------------------------------- queries
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free - self.num_protected

    def usage(self) -> float:
        """vLLM's kv_cache_usage: share of blocks not reclaimable for free (in use or pinned)."""
        return (self.num_blocks - self.num_free) / self.num_blocks

    def cached_blocks(self, pid: int) -> int:
        e = self.entries.get(pid)
        return e.blocks if e is not None and e.state in (FREE, PROTECTED) else 0

    def protect_until(self, pid: int) -> float | None:
        e = self.entries.get(pid)
        return e.until if e is not None and e.state == PROTECTED else None

    def tier(self, pid: int) -> str | None:
        if self.cached_blocks(pid):
            return "device"
        return "host" if self.host.get(pid) else None

    def next_deadline(self) -> float:
        while self._expiry:
            until, seq, e = self._expiry[0]
            if e.state == PROTECTED and e.seq == seq:
                return until
            heapq.heappop(self._expiry)
        return math.inf

    # ---------------------------------------------------------------- queue plumbing
    def _push_blank(self, n: int, key: float) -> None:
        if n > 0:
            heapq.heappush(self._free, (key, next(self._seq), None, n))

    def _push_free(self, e: KVEntry, key: float) -> None:
        e.state, e.key, e.seq = FREE, key, next(self._seq)
        heapq.heappush(self._free, (key, e.seq, e, 0))
        self.num_free += e.blocks

    def _detach(self, e: KVEntry) -> None:
        """Take an entry out of whichever pool it sits in (heaps are cleaned lazily)."""
        if e.state == FREE:
            self.num_free -= e.blocks
        elif e.state == PROTECTED:
            self.num_protected -= e.blocks
        e.state = GONE

    def expire(self, now: float) -> list[KVEntry]:
        """Move protected entries whose deadline has passed into the free queue."""
        out = []
        while self._expiry and self._expiry[0][0] <= now:
            until, seq, e = heapq.heappop(self._expiry)
            if e.state != PROTECTED or e.seq != seq:
                continue
            self._detach(e)
            if e.then == "offload":
                self._offload(e, until)
            else:
                self._push_free(e, e.value if e.value is not None else until)
            out.append(e)
        return out

    # ---------------------------------------------------------------- allocation
    def can_allocate(self, n: int, reserved: int = 0) -> bool:
        return n <= self.num_free + self.num_protected - reserved

    def allocate(self, n: int) -> None:
        """Take n blocks, reclaiming cached blocks in Eq. 5 order. Caller checked capacity."""
        free = self._free
        while n > 0 and free:
            key, seq, e, cnt = free[0]
            if e is None:
                take = min(cnt, n)
                if take == cnt:
                    heapq.heappop(free)
                else:
                    heapq.heapreplace(free, (key, seq, None, cnt - take))
            else:
                if e.state != FREE or e.seq != seq:
                    heapq.heappop(free)
                    continue
                take = min(e.blocks, n)
                e.blocks -= take
                self.evicted_blocks += take
                if e.blocks == 0:
                    heapq.heappop(free)
                    e.state = GONE
            self.num_free -= take
            n -= take
        prot = self._prot
        while n > 0 and prot:
            key, seq, e = prot[0]
            if e.state != PROTECTED or e.seq != seq:
                heapq.heappop(prot)
                continue
            take = min(e.blocks, n)
            e.blocks -= take
            self.evicted_blocks += take
            self.num_protected -= take
            if e.blocks == 0:
                heapq.heappop(prot)
                e.state = GONE
            n -= take
        if n > 0:
            raise RuntimeError("KV pool over-allocated: capacity check was skipped")

    def free_blank(self, n: int, now: float) -> None:
        """Return blocks that carry no reusable prefix (partial tails, dropped KV)."""
        self._push_blank(n, now)
        self.num_free += n

    # ---------------------------------------------------------------- program KV
    def hittable(self, pid: int, shared_tokens: int, num_tokens: int) -> tuple[int, int]:
        """(device hit blocks, host hit blocks) for a call sharing `shared_tokens` with the stream."""
        cap = min(shared_tokens, num_tokens - 1) // self.block_size
        dev = min(self.cached_blocks(pid), cap)
        host = min(self.host.get(pid, 0), cap)
        return dev, max(0, host - dev)

    def touch(self, pid: int, hit_blocks: int, now: float) -> None:
        """A call of `pid` takes its device hit; the rest of the old run is stale."""
        e = self.entries.get(pid)
        if e is None or e.state not in (FREE, PROTECTED):
            return
        self._detach(e)
        stale = e.blocks - hit_blocks
        e.blocks = 0
        if stale > 0:
            self.free_blank(stale, now)

    def take_host(self, pid: int) -> None:
        n = self.host.pop(pid, 0)
        self.host_used -= n

    def store(self, pid: int, full_blocks: int, total_blocks: int, now: float, kind: str,
              until: float | None = None, value: float | None = None, then: str = "release") -> None:
        """A request of `pid` gave back `total_blocks`, the first `full_blocks` hashed.

        kind: "release" (cached, LRU), "protect" (pinned until `until`), "evict" (dropped),
        "offload" (copied to the host tier, device blocks dropped). "none", and "protect" with
        a deadline at or before `now`, are a release (paper §3.4: d = c releases at completion).
        """
        e = self.entries.get(pid)
        if e is None:
            e = self.entries[pid] = KVEntry(pid)
        elif e.state in (FREE, PROTECTED):  # an older run still cached: superseded
            self._detach(e)
            self.free_blank(e.blocks, now)
        self.free_blank(total_blocks - full_blocks, now)
        e.blocks, e.until, e.value, e.then = full_blocks, None, None, "release"
        if kind == "protect" and until is not None and until > now and full_blocks > 0:
            e.state, e.until, e.value, e.then = PROTECTED, until, value, then
            e.seq = next(self._seq)
            heapq.heappush(self._prot, (value if value is not None else until, e.seq, e))
            heapq.heappush(self._expiry, (until, e.seq, e))
            self.num_protected += full_blocks
        elif kind == "evict":
            e.blocks = 0
            e.state = GONE
            self.free_blank(full_blocks, now)
        elif kind == "offload" or (kind == "protect" and then == "offload"):
            e.state = GONE
            self._offload(e, now)
        else:
            self._push_free(e, value if value is not None else now)

    def apply(self, pid: int, kind: str, now: float, until: float | None = None,
              value: float | None = None, then: str = "release") -> None:
        """Change the retention state of a program's cached (not in-use) run."""
        e = self.entries.get(pid)
        if e is None or e.state not in (FREE, PROTECTED) or kind == "none":
            return
        blocks = e.blocks
        self._detach(e)
        e.blocks = 0
        self.store(pid, blocks, blocks, now, kind, until, value, then)

    def _offload(self, e: KVEntry, now: float) -> None:
        """Copy the run to host memory (LRU there) and give its device blocks back blank."""
        n = e.blocks
        e.blocks = 0
        e.state = GONE
        self.free_blank(n, now)
        if n == 0 or self.host_blocks <= 0:
            return
        n = min(n, self.host_blocks)
        self.take_host(e.pid)
        while self.host_used + n > self.host_blocks and self.host:
            old = next(iter(self.host))
            self.take_host(old)
        self.host[e.pid] = n
        self.host_used += n

    # ---------------------------------------------------------------- checking
    def audit(self, held_by_requests: int) -> None:
        """Raise AssertionError if the block accounting is inconsistent (used by tests)."""
        blank = sum(cnt for _, _, e, cnt in self._free if e is None)
        cached_free = sum(e.blocks for e in self.entries.values() if e.state == FREE)
        cached_prot = sum(e.blocks for e in self.entries.values() if e.state == PROTECTED)
        assert self.num_free == blank + cached_free, (self.num_free, blank, cached_free)
        assert self.num_protected == cached_prot, (self.num_protected, cached_prot)
        assert self.num_used == held_by_requests, (self.num_used, held_by_requests)
        assert 0 <= self.num_used <= self.num_blocks
        assert self.num_free >= 0 and self.num_protected >= 0
        assert self.host_used == sum(self.host.values()) <= max(self.host_blocks, 0)
