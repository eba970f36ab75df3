# hostile: type(x).mro() to reach object
# axis: scheduling
# gate: reject 'type'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return len(type(pcb).mro()[-1].mro())
