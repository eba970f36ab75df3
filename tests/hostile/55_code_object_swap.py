# hostile: replace a method's code object
# axis: scheduling
# gate: reject dunder
# worker: violation TypeError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        def g():
            return 1
        P.priority.__code__ = g.__code__
        return 0
