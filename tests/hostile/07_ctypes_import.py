# hostile: import ctypes and call libc system()
# axis: scheduling
# gate: reject import of 'ctypes'
# worker: violation not allowed
# worker-noaudit: contained
import ctypes


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        ctypes.CDLL(None).system(b"touch /tmp/agentservesim-canary/07")
        return 0
