# hostile: str.format traversal without dunder text (gi_frame)
# axis: scheduling
# gate: reject attribute '.format'
# worker: violation blocked operation: object.__getattr__ gi_frame
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        g = (x for x in [1])
        s = "{0.gi_frame.f_lineno}".format(g)
        return len(s)
