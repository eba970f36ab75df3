# hostile: a routing class submitted as a scheduling policy
# axis: scheduling
# gate: reject axis
# worker: violation defines no subclass of SchedulingPolicy
# worker-noaudit: contained
class P(RoutingPolicy):
    def select(self, pcb, inflight, now):
        return 0
