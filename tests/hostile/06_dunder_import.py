# hostile: call __import__ directly
# axis: scheduling
# gate: reject dunder
# worker: violation not allowed
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        __import__("os").system("touch /tmp/agentservesim-canary/06")
        return 0
