"""Paged KV cache of one instance: vLLM v1's `BlockPool` + `KVCacheManager`, kept per run of blocks.

vLLM tracks every block; a program's calls extend one token stream, so we track the blocks a
request gives back together as one `Run` (a few index ranges of that stream) and reproduce
the block pool's decisions exactly at that granularity (vllm/v1/core/block_pool.py,
kv_cache_utils.py `FreeKVCacheBlockQueue`, single_type_kv_cache_manager.py):

* **Null block.** The pool reserves one block (`BlockPool.null_block`): of `num_blocks`,
  `num_blocks - 1` are usable, and `usage()` divides by that (`BlockPool.get_usage`).
* **Free queue order.** `BlockPool.free_blocks` appends blocks that carry a prefix hash
  to the queue's tail (reused last, LRU) and *prepends* blocks without one (reused first).
  A request frees its blocks tail first, so eviction eats a run from its highest index.
  Blocks without a hash (never used, a request's partial last block, dropped KV) are
  therefore one count at the queue's head (`num_blank`); cached runs follow, oldest first.
* **Which blocks carry a hash.** A request's blocks are hashed when they are scheduled
  (`KVCacheManager.allocate_slots` -> `cache_blocks` up to min(computed + new, num_tokens)),
  so the caller passes the number of full blocks when it gives them back.
* **Prefix hits** (`FullAttentionManager.find_longest_cache_hit`): the longest chain of
  cached full blocks from the start, at most `num_tokens - 1` tokens. A block index may be
  cached twice (a preempted request's last block that its re-admission could not reuse is
  recomputed); the hash map then returns the copy cached first (`BlockHashToBlockMap`),
  which is the one `admit` takes out of the queue. Copies nobody takes stay where they are.
* **Retention** (paper Eq. 5) replaces the LRU key for program KV: a run's key is its value
  (default: release time, i.e. vLLM's order); protected runs are pinned out of the queue
  and reclaimed only when nothing else is left, least value first.

A second, host-memory tier holds offloaded runs (LRU by offload time), reloaded on a hit
at the host link's bandwidth.
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import NamedTuple

from .policies.base import RetentionKind

FREE, PROTECTED, GONE = 0, 1, 2
_NEVER = 1 << 62  # live bound of a block index no divergence has cut


def _minus(span: tuple[int, int], cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [span) outside the disjoint ranges `cuts`, ascending."""
    out, lo = [], span[0]
    for a, b in sorted(cuts):
        if a > lo:
            out.append((lo, min(a, span[1])))
        lo = max(lo, b)
    if lo < span[1]:
        out.append((lo, span[1]))
    return [s for s in out if s[0] < s[1]]


class Residency(NamedTuple):
    """A program's KV on one instance, as policies may observe it."""
    tokens: int                  # cached prefix (device), in tokens
    protect_until: float | None  # deadline of the protected run, if any
    tier: str | None             # "device", "host" or None


class Run:
    """Blocks of one program given back together, in the order the free queue holds them.

    `pieces` are [lo, hi, stamp, live] block-index ranges, ascending: the queue reuses the
    last piece's highest index first. `stamp` orders copies of one index by the time they
    were cached; indices at or beyond `live` no longer match the program's stream.
    """
    __slots__ = ("pid", "pieces", "blocks", "state", "key", "seq", "until", "value", "then")

    def __init__(self, pid: int, pieces: list[list[int]]) -> None:
        self.pid = pid
        self.pieces = pieces
        self.blocks = sum(p[1] - p[0] for p in pieces)
        self.state = GONE
        self.key = 0.0
        self.seq = 0
        self.until: float | None = None
        self.value: float | None = None
        self.then = "release"


class KVManager:
    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0,
                 enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks (one is vLLM's null block), got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks            # vLLM's num_gpu_blocks, null block included
        self.enable_caching = enable_caching
        self._seq = itertools.count()
        self._stamp = itertools.count(1)
        self.num_blank = num_blocks - 1          # blocks without a hash: the free queue's head
        self._free: list[tuple[float, int, Run]] = []     # cached, unprotected, by (key, seq)
        self._prot: list[tuple[float, int, Run]] = []     # protected, by value
        self._expiry: list[tuple[float, int, Run]] = []   # protected, by deadline
        self.num_free = self.num_blank           # blank + unprotected cached blocks
        self.num_protected = 0
        self._runs: dict[int, list[Run]] = {}    # pid -> its cached runs (lazily pruned)
        self._last: dict[int, Run] = {}          # pid -> the run its last call gave back
        self._tables: dict[int, tuple[list[list[int]], int]] = {}  # pid -> (hit pieces, stamp) in use
        self.host_blocks = host_blocks
        self.host: dict[int, int] = {}      # pid -> blocks on host, insertion = LRU order
        self.host_used = 0

    # ---------------------------------------------------------------- queries
    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_used(self) -> int:
        return self.num_usable - self.num_free - self.num_protected

    def available(self) -> int:
        """Blocks an allocation may take (free queue, then protected runs as a last resort)."""
        return self.num_free + self.num_protected

    def usage(self) -> float:
        """vLLM's kv_cache_usage: share of usable blocks not in the free queue (in use or pinned)."""
        return 1.0 - self.num_free / self.num_usable

    def _alive(self, pid: int) -> list[Run]:
        runs = self._runs.get(pid)
        if not runs:
            return []
        keep = [r for r in runs if r.state != GONE and r.blocks > 0]
        if len(keep) != len(runs):
            if keep:
                self._runs[pid] = keep
            else:
                del self._runs[pid]
        return keep

    def _chain(self, pid: int) -> int:
        """Length in blocks of the longest cached chain from index 0."""
        runs = self._runs.get(pid)
        if not runs:
            return 0
        if len(runs) == 1 and len(runs[0].pieces) == 1:  # the usual case: one run, one piece
            r, p = runs[0], runs[0].pieces[0]
            return min(p[1], p[3]) if r.state != GONE and p[0] == 0 and p[1] > 0 else 0
        spans = sorted((p[0], min(p[1], p[3])) for r in self._alive(pid) for p in r.pieces if p[0] < p[3])
        h = 0
        for lo, hi in spans:
            if lo > h:
                break
            h = max(h, hi)
        return h

    def _copied(self, pid: int, n: int) -> bool:
        """Another cached copy of one of `pid`'s block indices 0..n-1 is still hittable."""
        return any(p[0] < min(p[1], p[3], n) for r in self._alive(pid) for p in r.pieces)

    cached_blocks = _chain  # public name: blocks of `pid`'s prefix cached on this device

    def residency(self, pid: int) -> Residency:
        blocks = self._chain(pid)
        last = self._last.get(pid)
        until = last.until if last is not None and last.state == PROTECTED else None
        tier = "device" if blocks else ("host" if self.host.get(pid) else None)
        return Residency(blocks * self.block_size, until, tier)

    def next_deadline(self) -> float:
        while self._expiry:
            until, seq, r = self._expiry[0]
            if r.state == PROTECTED and r.seq == seq:
                return until
            heapq.heappop(self._expiry)
        return math.inf

    # ---------------------------------------------------------------- queue plumbing
    def _track(self, r: Run) -> None:
        self._runs.setdefault(r.pid, []).append(r)

    def _push_free(self, r: Run, key: float) -> None:
        r.state, r.key, r.seq = FREE, key, next(self._seq)
        heapq.heappush(self._free, (key, r.seq, r))
        self.num_free += r.blocks

    def _push_protected(self, r: Run, until: float, value: float | None, then: str) -> None:
        r.state, r.until, r.value, r.then = PROTECTED, until, value, then
        r.seq = next(self._seq)
        heapq.heappush(self._prot, (value if value is not None else until, r.seq, r))
        heapq.heappush(self._expiry, (until, r.seq, r))
        self.num_protected += r.blocks

    def _detach(self, r: Run) -> None:
        """Take a run out of whichever pool it sits in (heaps are cleaned lazily)."""
        if r.state == FREE:
            self.num_free -= r.blocks
        elif r.state == PROTECTED:
            self.num_protected -= r.blocks
        r.state = GONE

    def expire(self, now: float) -> None:
        """Move protected runs whose deadline has passed into the free queue (or to the host)."""
        while self._expiry and self._expiry[0][0] <= now:
            until, seq, r = heapq.heappop(self._expiry)
            if r.state != PROTECTED or r.seq != seq:
                continue
            self._detach(r)
            if r.then == RetentionKind.OFFLOAD:
                self._offload(r, until)
            else:
                self._push_free(r, r.value if r.value is not None else until)

    # ---------------------------------------------------------------- allocation
    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free + self.num_protected

    def allocate(self, n: int) -> None:
        """Take n blocks from the head of the free queue, then from protected runs (Eq. 5).
        The caller checked capacity (`can_allocate`)."""
        take = min(self.num_blank, n)
        self.num_blank -= take
        self.num_free -= take
        n -= take
        if n > 0:
            n = self._reclaim(self._free, FREE, n)
        if n > 0:
            n = self._reclaim(self._prot, PROTECTED, n)
        if n > 0:
            raise RuntimeError("KV pool over-allocated: capacity check was skipped")

    def _reclaim(self, heap: list, state: int, n: int) -> int:
        while n > 0 and heap:
            _, seq, r = heap[0]
            if r.state != state or r.seq != seq:
                heapq.heappop(heap)
                continue
            pieces = r.pieces
            while n > 0 and pieces:
                p = pieces[-1]
                take = min(p[1] - p[0], n)
                p[1] -= take
                r.blocks -= take
                n -= take
                if state == FREE:
                    self.num_free -= take
                else:
                    self.num_protected -= take
                if p[1] == p[0]:
                    pieces.pop()
            if r.blocks == 0:
                heapq.heappop(heap)
                r.state = GONE
        return n

    def free_blank(self, n: int) -> None:
        """Give back blocks that carry no prefix hash: vLLM prepends them (reused first)."""
        self.num_blank += n
        self.num_free += n

    # ---------------------------------------------------------------- program KV
    def lookup(self, pid: int, shared_tokens: int, num_tokens: int) -> tuple[int, int]:
        """(device hit blocks, host hit blocks) for a request of `pid` whose first
        `shared_tokens` tokens are the program's cached stream (KVCacheManager.get_computed_blocks)."""
        if not self.enable_caching:
            return 0, 0
        bs = self.block_size
        diverge = shared_tokens // bs
        cap = min(diverge, (num_tokens - 1) // bs)
        dev = 0
        if pid in self._runs:
            for r in self._alive(pid):  # blocks past the divergence hash differently from now on
                for p in r.pieces:
                    if p[3] > diverge:
                        p[3] = diverge
            dev = min(self._chain(pid), cap)
        host = min(self.host.get(pid, 0), cap)
        return dev, max(0, host - dev)

    def admit(self, pid: int, hit_blocks: int, now: float) -> None:
        """A request of `pid` starts and takes its device hit (BlockPool.touch): for each
        index the copy cached first leaves the queue; everything else stays in place."""
        stamp = next(self._stamp)
        table: list[list[int]] = []
        runs = self._runs.get(pid) if hit_blocks > 0 else None
        if runs and len(runs) == 1 and len(runs[0].pieces) == 1:  # the usual case: one copy
            r, p = runs[0], runs[0].pieces[0]
            table.append([0, hit_blocks, p[2], _NEVER])
            if hit_blocks < p[1]:
                p[0] = hit_blocks
            else:
                r.pieces = []
            r.blocks -= hit_blocks
            if r.state == FREE:
                self.num_free -= hit_blocks
            else:
                self.num_protected -= hit_blocks
            if r.blocks == 0:
                r.state = GONE
            elif r.state == PROTECTED:
                self._detach(r)
                self._push_free(r, now)
        elif hit_blocks > 0:
            copies = sorted(((p[2], p[0], r, p) for r in self._alive(pid) for p in r.pieces),
                            key=lambda c: (c[0], c[1]))
            need = [(0, hit_blocks)]  # index ranges still to take, disjoint
            touched: list[Run] = []
            for st, _, r, p in copies:
                if not need:
                    break
                hi = min(p[1], p[3], hit_blocks)
                took = [(max(a, p[0]), min(b, hi)) for a, b in need if max(a, p[0]) < min(b, hi)]
                if not took:
                    continue
                need = [s for a, b in need for s in _minus((a, b), took)]
                table.extend([x, y, st, _NEVER] for x, y in took)
                self._cut(r, p, took)
                touched.append(r)
            if need:
                raise RuntimeError(f"program {pid}: hit of {hit_blocks} blocks is not cached")
            for r in touched:
                if r.state == PROTECTED and r.blocks > 0:  # the pin held the rest for this call only
                    self._detach(r)
                    self._push_free(r, now)
            table.sort()
        self._tables[pid] = (table, stamp)

    def _cut(self, r: Run, p: list[int], took: list[tuple[int, int]]) -> None:
        """Remove the block index ranges `took` (inside piece `p`) from run `r`: they go into use."""
        i = r.pieces.index(p)
        r.pieces[i:i + 1] = [[a, b, p[2], p[3]] for a, b in _minus((p[0], p[1]), took)]
        n = sum(y - x for x, y in took)
        r.blocks -= n
        if r.state == FREE:
            self.num_free -= n
        elif r.state == PROTECTED:
            self.num_protected -= n
        if r.blocks == 0:
            r.state = GONE

    def take_host(self, pid: int) -> None:
        n = self.host.pop(pid, 0)
        self.host_used -= n

    def release(self, pid: int, full_blocks: int, total_blocks: int, now: float,
                kind: str = RetentionKind.RELEASE, until: float | None = None, value: float | None = None,
                then: str = RetentionKind.RELEASE) -> None:
        """The request of `pid` gave back `total_blocks`, the first `full_blocks` hashed.

        kind: "release" (cached, LRU), "protect" (pinned until `until`), "evict" (dropped),
        "offload" (copied to the host tier, device blocks dropped). "none", and "protect" with
        a deadline at or before `now`, are a release (paper §3.4: d = c releases at completion).
        """
        table, stamp = self._tables.pop(pid, ([], 0))
        if not self.enable_caching:
            self.free_blank(total_blocks)
            return
        hit = table[-1][1] if table else 0
        if full_blocks > hit:
            table.append([hit, full_blocks, stamp, _NEVER])
        if len(table) > 1 and (pid not in self._runs or not self._copied(pid, full_blocks)):
            # No other copy of these blocks exists, and later copies will be younger than
            # this call: their cache order needs no finer stamps (keeps runs one piece).
            table = [[0, full_blocks, stamp, _NEVER]]
        self.free_blank(total_blocks - full_blocks)
        r = Run(pid, table)
        if r.blocks == 0:
            return
        self._track(r)
        self._last[pid] = r
        self._place(r, now, kind, until, value, then)

    def _place(self, r: Run, now: float, kind: str, until: float | None, value: float | None,
               then: str) -> None:
        if kind == RetentionKind.PROTECT and until is not None and until > now:
            self._push_protected(r, until, value, then)
        elif kind == RetentionKind.EVICT:
            n = r.blocks
            r.pieces, r.blocks, r.state = [], 0, GONE
            self.free_blank(n)
        elif kind == RetentionKind.OFFLOAD or (kind == RetentionKind.PROTECT and then == RetentionKind.OFFLOAD):
            self._offload(r, now)
        else:
            r.until = None
            self._push_free(r, value if value is not None else now)

    def apply(self, pid: int, kind: str, now: float, until: float | None = None,
              value: float | None = None, then: str = RetentionKind.RELEASE) -> None:
        """Change the retention state of the run a program's last call gave back (if cached)."""
        r = self._last.get(pid)
        if r is None or r.state == GONE or r.blocks == 0 or kind == RetentionKind.NONE:
            return
        self._detach(r)
        r.value, r.until, r.then = None, None, RetentionKind.RELEASE
        self._place(r, now, kind, until, value, then)

    def _offload(self, r: Run, now: float) -> None:
        """Copy the run to host memory (LRU there) and give its device blocks back blank."""
        n = r.blocks
        prefix = 0  # the host copy is the run's contiguous prefix
        for p in r.pieces:
            if p[0] != prefix:
                break
            prefix = p[1]
        r.pieces, r.blocks, r.state = [], 0, GONE
        self.free_blank(n)
        if prefix == 0 or self.host_blocks <= 0:
            return
        prefix = min(prefix, self.host_blocks)
        self.take_host(r.pid)
        while self.host_used + prefix > self.host_blocks and self.host:
            self.take_host(next(iter(self.host)))
        self.host[r.pid] = prefix
        self.host_used += prefix

    # ---------------------------------------------------------------- checking
    def free_queue(self) -> list[tuple[int, int, int]]:
        """The free queue from its head, as segments: (-1, count, 0) for blocks without a
        hash, (pid, first, last) for a program's cached block indices first..last, descending
        (the parity harness compares this with vLLM's FreeKVCacheBlockQueue)."""
        out: list[list[int]] = [[-1, self.num_blank, 0]] if self.num_blank else []
        for _, seq, r in sorted(e for e in self._free if e[2].state == FREE and e[2].seq == e[1]):
            for lo, hi, _, _ in reversed(r.pieces):
                if out and out[-1][0] == r.pid and out[-1][2] == hi:
                    out[-1][2] = lo
                else:
                    out.append([r.pid, hi - 1, lo])
        return [(pid, a, b) for pid, a, b in out]

    def audit(self, held_by_requests: int) -> None:
        """Raise AssertionError if the block accounting is inconsistent (used by tests)."""
        runs = [r for rs in self._runs.values() for r in rs if r.state != GONE]
        for r in runs:
            assert r.blocks == sum(p[1] - p[0] for p in r.pieces) > 0, (r.pid, r.pieces, r.blocks)
            assert all(p[0] < p[1] for p in r.pieces), r.pieces
            assert all(a[1] <= b[0] for a, b in zip(r.pieces, r.pieces[1:])), r.pieces
        cached_free = sum(r.blocks for r in runs if r.state == FREE)
        cached_prot = sum(r.blocks for r in runs if r.state == PROTECTED)
        assert self.num_free == self.num_blank + cached_free, (self.num_free, self.num_blank, cached_free)
        assert self.num_protected == cached_prot, (self.num_protected, cached_prot)
        assert self.num_used == held_by_requests, (self.num_used, held_by_requests)
        assert 0 <= self.num_used <= self.num_usable
        assert self.num_blank >= 0 and self.num_free >= 0 and self.num_protected >= 0
        assert self.host_used == sum(self.host.values()) <= max(self.host_blocks, 0)
