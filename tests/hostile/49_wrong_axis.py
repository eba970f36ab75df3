# hostile: a routing class submitted as a scheduling policy
# axis: scheduling
# gate: reject axis
# worker: violation exactly one
# worker-noaudit: contained
class P(RoutingPolicy):
    def select(self, pcb, inflight, now):
        return 0
