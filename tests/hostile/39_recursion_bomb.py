# hostile: unbounded recursion
# axis: scheduling
# gate: pass
# worker: violation RecursionError
# worker-noaudit: contained
def f(n):
    return f(n + 1) + 1


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return f(0)
