"""Seed routing policy: session affinity with a least-loaded fallback.

A program's next call goes back to the instance that served its previous call (where its
KV prefix is likely cached) unless that instance is overloaded compared with the least
loaded one; otherwise, and for a program's first call, the least-loaded instance wins
(fewest running + waiting requests, then lowest KV utilisation, then lowest index).
The search may change only the region between the EVOLVE-BLOCK markers.
"""
import math  # noqa: F401  (available to evolved versions)

# EVOLVE-BLOCK-START
class EvolvedRouting(RoutingPolicy):
    MAX_EXTRA_INFLIGHT = 4
    MAX_KV_UTILIZATION = 0.95

    def least_loaded(self, inflight):
        best = 0
        best_key = None
        for inst in inflight:
            key = (inst.running + inst.waiting, inst.kv_utilization, inst.index)
            if best_key is None or key < best_key:
                best, best_key = inst.index, key
        return best

    def select(self, pcb, inflight, now):
        fallback = self.least_loaded(inflight)
        last = pcb.last_instance
        if last is None or not 0 <= last < len(inflight):
            return fallback
        home = inflight[last]
        least = inflight[fallback]
        overloaded = (home.running + home.waiting
                      > least.running + least.waiting + self.MAX_EXTRA_INFLIGHT)
        if overloaded or home.kv_utilization > self.MAX_KV_UTILIZATION:
            return fallback
        return last
# EVOLVE-BLOCK-END
