"""Shipped routing policies (paper §3.3)."""
from __future__ import annotations

from .base import InstanceView, ProgramView, RoutingPolicy


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self) -> None:
        self.next = 0

    def select(self, pcb: ProgramView, inflight: tuple[InstanceView, ...], now: float) -> int:
        i = self.next % len(inflight)
        self.next += 1
        return i


def _least_loaded(inflight: tuple[InstanceView, ...]) -> int:
    return min(inflight, key=lambda v: (v.inflight, v.kv_utilization, v.index)).index


class LeastLoaded(RoutingPolicy):
    """Fewest running + waiting calls; KV utilisation breaks ties."""
    name = "least-loaded"

    def select(self, pcb: ProgramView, inflight: tuple[InstanceView, ...], now: float) -> int:
        return _least_loaded(inflight)


class SessionAffinity(RoutingPolicy):
    """Reuse the program's previous instance unless it is over capacity, then least-loaded."""
    name = "session-affinity"
    MAX_KV_UTILIZATION = 0.95
    MAX_INFLIGHT_RATIO = 2.0   # fallback when the home queue is this many times the lightest

    def select(self, pcb: ProgramView, inflight: tuple[InstanceView, ...], now: float) -> int:
        home = pcb.last_instance
        if home is None:
            return _least_loaded(inflight)
        h = inflight[home]
        lightest = min(v.inflight for v in inflight)
        if h.kv_utilization > self.MAX_KV_UTILIZATION or h.inflight > self.MAX_INFLIGHT_RATIO * lightest + 2:
            return _least_loaded(inflight)
        return home


SHIPPED = {c.name: c for c in (RoundRobin, LeastLoaded, SessionAffinity)}
