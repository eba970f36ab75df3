# hostile: engine_args that the engine does not accept
# axis: scheduling
# gate: pass
# worker: violation engine_args
# worker-noaudit: contained
class P(SchedulingPolicy):
    engine_args = {"scheduling_policy": "oracle-sjf"}

    def priority(self, pcb, now):
        return 0
