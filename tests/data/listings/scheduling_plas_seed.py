# Paper Appendix F, Listing 3: seed scheduling policy, PLAS (Luo et al., 2025).
class EvolvedScheduling(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb, now):
        return int(round(pcb.attained_service_s * 1000.0))
