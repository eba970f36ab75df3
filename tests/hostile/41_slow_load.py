# hostile: an infinite loop at import time
# axis: scheduling
# gate: pass
# worker: violation deadline
# worker-noaudit: contained
while True:
    pass


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return 0
