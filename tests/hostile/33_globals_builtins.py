# hostile: globals()['__builtins__'] to recover the real builtins
# axis: scheduling
# gate: reject 'globals'
# worker: violation NameError
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        b = globals()["_" "_builtins_" "_"]
        return len(b)
