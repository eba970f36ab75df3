# hostile: dataclasses.builtins.open (a module reachable as an attribute)
# axis: scheduling
# gate: reject 'dataclasses.builtins' is not available
# worker: violation AttributeError
# worker-noaudit: contained
import dataclasses


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        dataclasses.builtins.open("/tmp/agentservesim-canary/36", "w").write("x")
        return 0
