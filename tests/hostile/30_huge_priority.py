# hostile: return a 40-digit priority (clamped, contained)
# axis: scheduling
# gate: pass
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return 10 ** 40
