"""Shipped scheduling policies (paper Eq. 4). Smaller priority runs first, as in vLLM."""
from __future__ import annotations

from .base import ProgramView, SchedulingPolicy


class FCFS(SchedulingPolicy):
    """q = r_{p,k}: vLLM's own FCFS queue (release order)."""
    name = "fcfs"
    engine_args = {"scheduling_policy": "fcfs"}

    def priority(self, pcb: ProgramView, now: float) -> int:
        return int(round((pcb.release_s or now) * 1000.0))


class ProgramFCFS(SchedulingPolicy):
    """q = a_p: program arrival order (Continuum)."""
    name = "program-fcfs"

    def priority(self, pcb: ProgramView, now: float) -> int:
        return int(round(pcb.arrival_s * 1000.0))


class PLAS(SchedulingPolicy):
    """q = A_p(r_{p,k}): least attained service first (Autellix), in ms."""
    name = "plas"

    def priority(self, pcb: ProgramView, now: float) -> int:
        return int(round(pcb.attained_service_s * 1000.0))


SHIPPED = {c.name: c for c in (FCFS, ProgramFCFS, PLAS)}
