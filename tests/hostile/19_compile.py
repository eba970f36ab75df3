# hostile: compile a code object
# axis: scheduling
# gate: reject 'compile'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return len(compile("1", "x", "eval").co_consts)
