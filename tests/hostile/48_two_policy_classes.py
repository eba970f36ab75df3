# hostile: two policy classes in one file
# axis: scheduling
# gate: reject exactly one
# worker: violation exactly one
# worker-noaudit: contained
class A(SchedulingPolicy):
    def priority(self, pcb, now):
        return 0


class B(SchedulingPolicy):
    def priority(self, pcb, now):
        return 1
