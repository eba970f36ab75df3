# hostile: a dunder spelt with escapes in a string literal
# axis: scheduling
# gate: reject strings containing
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return len("\x5f\x5fclass\x5f\x5f")
