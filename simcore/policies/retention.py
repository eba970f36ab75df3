"""Shipped retention policies (paper §3.4, Eq. 6, Appendix E)."""
from __future__ import annotations

import math
from collections import defaultdict

from .base import ProgramView, RetentionPolicy


class EvictAlways(RetentionPolicy):
    """Request-scoped KV lifetime: drop the KV when the call completes."""
    name = "evict-always"

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        return "evict"


class CacheLRU(RetentionPolicy):
    """vLLM's default: freed KV stays hittable and is reclaimed least-recently-used first."""
    name = "cache-lru"

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        return "release"


class TTL(RetentionPolicy):
    """Fixed TTL (Continuum): protect for tau seconds after completion."""
    name = "ttl"
    TAU_S = 2.0

    def __init__(self, tau_s: float | None = None) -> None:
        if tau_s is not None:
            self.TAU_S = tau_s

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        return ("protect", now + self.TAU_S)

    def on_turn_arrival(self, pcb: ProgramView, now: float):
        return "release"


class PressureTTL(TTL):
    """Pressure-scaled TTL (SAGA, paper Eq. 9): tau shrinks linearly to tau/2 from 70% to 90% use."""
    name = "pressure-ttl"

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        u = self.signals.kv_utilization or 0.0
        m = min(1.0, max(0.0, (u - 0.7) / (0.9 - 0.7)))
        return ("protect", now + self.TAU_S * (1.0 - 0.5 * m))


class _GapQuantiles:
    """Observed tool gaps per tool name (revealed when the tool returns)."""

    def __init__(self) -> None:
        self.gaps: dict[str | None, list[float]] = defaultdict(list)

    def observe(self, pcb: ProgramView, now: float) -> None:
        g = pcb.gap_elapsed_s(now)
        if g is not None:
            self.gaps[pcb.tool_name].append(g)

    def quantile(self, tool: str | None, q: float, default: float) -> float:
        xs = sorted(self.gaps.get(tool, ()))
        if not xs:
            return default
        pos = q * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class ContinuumTTL(RetentionPolicy):
    """Per-tool TTL (Continuum): the 0.9 quantile of observed gaps of this tool, default 2 s."""
    name = "continuum"
    QUANTILE = 0.9
    DEFAULT_S = 2.0

    def __init__(self) -> None:
        self.stats = _GapQuantiles()

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        return ("protect", now + self.stats.quantile(pcb.tool_name, self.QUANTILE, self.DEFAULT_S))

    def on_turn_arrival(self, pcb: ProgramView, now: float):
        self.stats.observe(pcb, now)
        return "release"


class MinWaste(RetentionPolicy):
    """InferCept's retain-vs-discard test (paper Appendix E).

    Retain (protect until the predicted gap) when the memory-time cost of holding the
    context over the gap, g * n token-seconds, is at most the waste of discarding it:
    re-prefilling n tokens in chunks of c_h = max(S - n_inflight, 1), during which the
    context's chunks and the running batch are both held up. t(n) = (a n + c) / 1000 s is
    the per-device forward-pass model (a: ms per token, c: ms per pass).
    """
    name = "min-waste"
    QUANTILE = 0.9
    DEFAULT_GAP_S = 1.0
    A_MS_PER_TOKEN = 0.25   # RTX PRO 6000, 70B TP2: ~4.1 s per 16k-token prefill step
    C_MS = 57.0             # a decode-only step

    def __init__(self) -> None:
        self.stats = _GapQuantiles()
        self.budget = 16384

    def _waste_discard(self, n: int) -> float:
        inflight = 0
        for inst in self.signals.instances:
            inflight += inst.running
        c_h = max(self.budget - inflight, 1)
        chunks = math.ceil(n / c_h)
        t_chunk = (self.A_MS_PER_TOKEN * min(n, c_h) + self.C_MS) / 1000.0
        # Each chunk re-computes c_h tokens while the already-prefilled part and the running
        # batch wait: InferCept Eq. 4's token-seconds of recomputation plus stall.
        waste = 0.0
        done = 0
        for _ in range(chunks):
            step = min(c_h, n - done)
            waste += t_chunk * (done + step + inflight)
            done += step
        return waste

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        gap = self.stats.quantile(pcb.tool_name, self.QUANTILE, self.DEFAULT_GAP_S)
        n = pcb.context_tokens
        if gap * n <= self._waste_discard(n):
            return ("protect", now + gap)
        return "release"  # d = c: released at completion, reclaimable like any cached KV

    def on_turn_arrival(self, pcb: ProgramView, now: float):
        self.stats.observe(pcb, now)
        return "release"


class OffloadTTL(TTL):
    """TTL whose expiry offloads the KV to host memory instead of dropping it to the LRU pool.

    The paper names the host tier but ships no policy for it. Protection buys tau seconds on
    the device; afterwards the run is copied to host DRAM (if the instance has a host tier)
    and reloaded at the host link's bandwidth when the next call arrives, instead of being
    recomputed.
    """
    name = "offload-ttl"

    def on_turn_complete(self, pcb: ProgramView, request_id: str, now: float):
        return ("protect", now + self.TAU_S, None, "offload")


SHIPPED = {c.name: c for c in (EvictAlways, CacheLRU, TTL, PressureTTL, ContinuumTTL, MinWaste, OffloadTTL)}
