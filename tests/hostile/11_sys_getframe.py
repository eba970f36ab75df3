# hostile: sys._getframe to read the caller's locals
# axis: scheduling
# gate: reject import from 'sys'
# worker: violation not allowed
# worker-noaudit: contained
from sys import _getframe


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return len(_getframe(1).f_locals)
