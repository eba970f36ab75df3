"""Seed retention policy: fixed TTL, tau = 2 s (paper Listing 1; Continuum, Li et al. 2026).

When a call completes, the program's KV is protected for TAU_S seconds so that the next
call, released after the tool gap, finds its prefix cached; when the next call arrives the
protection is released and the entry falls back to LRU reclamation.
The search may change only the region between the EVOLVE-BLOCK markers.
"""
import math  # noqa: F401  (available to evolved versions)

# EVOLVE-BLOCK-START
class EvolvedRetention(RetentionPolicy):
    TAU_S = 2.0

    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", now + self.TAU_S)

    def on_turn_arrival(self, pcb, now):
        return "release"
# EVOLVE-BLOCK-END
