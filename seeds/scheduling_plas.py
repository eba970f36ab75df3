"""Seed scheduling policy: PLAS, program-level attained service (paper Listing 3; Autellix,
Luo et al. 2025).

Priority is the program's attained service A_p(t) in milliseconds; vLLM runs the smallest
priority first, so programs that have consumed little service go ahead of long-running ones.
The search may change only the region between the EVOLVE-BLOCK markers.
"""
import math  # noqa: F401  (available to evolved versions)

# EVOLVE-BLOCK-START
class EvolvedScheduling(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb, now):
        return int(round(pcb.attained_service_s * 1000.0))
# EVOLVE-BLOCK-END
