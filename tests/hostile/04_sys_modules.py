# hostile: reach any module through sys.modules
# axis: scheduling
# gate: reject import of 'sys'
# worker: violation not allowed
# worker-noaudit: contained
import sys


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        sys.modules["os"].system("touch /tmp/agentservesim-canary/04")
        return 0
