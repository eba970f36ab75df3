# hostile: walk tb_frame/f_back to the worker's globals and use its os
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: object.__getattr__ tb_frame
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            raise ValueError("x")
        except ValueError as e:
            f = e.__traceback__.tb_frame
        while f is not None:
            g = f.f_globals
            if "os" in g:
                return g["os"].system("touch /tmp/agentservesim-canary/09")
            f = f.f_back
        return 0
