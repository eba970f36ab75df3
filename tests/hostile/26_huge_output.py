# hostile: return a 200,000-element decision
# axis: scheduling
# gate: pass
# worker: violation larger than
# worker-noaudit: contained
# limits: decision_timeout_s=5
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return list(range(2 * 10 ** 5))
