# hostile: a metaclass that runs code at class creation
# axis: scheduling
# gate: reject 'type'
# worker: violation NameError
# worker-noaudit: contained
class M(type):
    pass


class P(SchedulingPolicy, metaclass=M):
    def priority(self, pcb, now):
        return 0
