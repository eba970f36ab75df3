# hostile: an infinite loop in the hook
# axis: scheduling
# gate: pass
# worker: violation deadline
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        while True:
            pass
