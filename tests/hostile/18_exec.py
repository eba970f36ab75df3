# hostile: exec a string
# axis: scheduling
# gate: reject 'exec'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        exec("x = 1")
        return 0
