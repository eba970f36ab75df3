# hostile: statistics.random._os.system (private module chain)
# axis: scheduling
# gate: reject 'statistics.random' is not available
# worker: violation AttributeError
# worker-noaudit: contained
import statistics


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        statistics.random._os.system("touch /tmp/agentservesim-canary/37")
        return 0
