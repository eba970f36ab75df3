# hostile: burn CPU in short slices, each under the deadline, to exhaust the budget
# axis: scheduling
# gate: pass
# worker: violation CPU budget
# worker-noaudit: contained
# limits: decision_timeout_s=5 cpu_budget_s=1 calls=40
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        x = 0
        for i in range(3_000_000):
            x += i
        return x % 7
