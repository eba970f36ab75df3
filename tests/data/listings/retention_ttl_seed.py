# Paper Appendix F, Listing 1: seed retention policy, TTL tau = 2 s (Li et al., 2026).
class EvolvedRetention(RetentionPolicy):
    TAU_S = 2.0

    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", now + self.TAU_S)

    def on_turn_arrival(self, pcb, now):
        return "release"
