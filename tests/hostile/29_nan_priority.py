# hostile: return NaN as a priority
# axis: scheduling
# gate: pass
# worker: violation finite
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return float("nan")
