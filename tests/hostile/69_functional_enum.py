# hostile: class 1 -- enum's functional API builds class attributes from run-time names (a dunder method, here)
# axis: scheduling
# gate: pass
# worker: violation functional Enum API
# worker-noaudit: violation functional Enum API
import enum

D = "_" * 2
E = enum.Enum("E", [("A", 1), (D + "init_subclass" + D, classmethod(lambda cls, **kw: None))])


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return 0
