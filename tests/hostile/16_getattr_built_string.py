# hostile: getattr with a dunder built at runtime
# axis: scheduling
# gate: reject 'getattr'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        u = chr(95) * 2
        cls = getattr(pcb, u + "class" + u)
        return len(getattr(cls, u + "subclasses" + u)())
