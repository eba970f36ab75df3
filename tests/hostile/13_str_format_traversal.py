# hostile: str.format field traversal to __class__ / __globals__
# axis: scheduling
# gate: reject strings containing
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        s = "{0.__class__.__init__.__globals__}".format(self)
        return len(s)
