# hostile: find ctypes.CDLL among object subclasses; libc system(), socket(), fork()
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: ctypes
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        for c in ().__class__.__base__.__subclasses__():
            if c.__name__ == "CDLL":
                libc = c(None)
                libc.system(b"touch /tmp/agentservesim-canary/08")
                if libc.socket(2, 1, 0) >= 0 or libc.fork() >= 0:
                    return 1
                return -1
        return 0
