# hostile: route to an instance that does not exist
# axis: routing
# gate: pass
# worker: violation valid range
# worker-noaudit: contained
class P(RoutingPolicy):
    def select(self, pcb, inflight, now):
        return 99
