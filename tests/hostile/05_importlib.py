# hostile: importlib.import_module('os')
# axis: routing
# gate: reject import of 'importlib'
# worker: violation not allowed
# worker-noaudit: contained
import importlib


class P(RoutingPolicy):
    def select(self, pcb, inflight, now):
        importlib.import_module("os").system("touch /tmp/agentservesim-canary/05")
        return 0
