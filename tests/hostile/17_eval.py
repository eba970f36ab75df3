# hostile: eval a string
# axis: scheduling
# gate: reject 'eval'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return eval("1 + 1")
