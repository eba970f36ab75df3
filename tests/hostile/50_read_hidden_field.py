# hostile: read a hidden field (the running call's output length)
# axis: scheduling
# gate: pass
# worker: violation AttributeError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return pcb.output_tokens
