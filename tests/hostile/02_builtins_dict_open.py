# hostile: fetch open() from the __builtins__ dict
# axis: scheduling
# gate: reject dunder
# worker: violation KeyError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        f = __builtins__["open"]("/tmp/agentservesim-canary/02", "w")
        f.write("x")
        return 0
