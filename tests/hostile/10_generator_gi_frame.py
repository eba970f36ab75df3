# hostile: generator gi_frame / f_back walk (no dunder)
# axis: scheduling
# gate: reject attribute '.gi_frame'
# worker: violation blocked operation: object.__getattr__ gi_frame
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        g = (x for x in [1])
        f = g.gi_frame.f_back.f_back
        return len(f.f_globals)
