# hostile: return a string as a priority
# axis: scheduling
# gate: pass
# worker: violation must be an int
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return "urgent"
