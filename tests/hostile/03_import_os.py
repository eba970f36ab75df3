# hostile: plain 'import os' and write a file
# axis: scheduling
# gate: reject import of 'os'
# worker: violation not allowed
# worker-noaudit: contained
import os


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        os.system("touch /tmp/agentservesim-canary/03")
        return 0
