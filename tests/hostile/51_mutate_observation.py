# hostile: mutate the observation to poison later decisions
# axis: scheduling
# gate: pass
# worker: violation FrozenInstanceError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        pcb.attained_service_s = 0.0
        return 0
