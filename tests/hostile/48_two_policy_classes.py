# hostile: two policy classes in one file (the worker picks the last, as in-process)
# axis: scheduling
# gate: reject exactly one
# worker: ok
# worker-noaudit: contained
class A(SchedulingPolicy):
    def priority(self, pcb, now):
        return 0


class B(SchedulingPolicy):
    def priority(self, pcb, now):
        return 1
