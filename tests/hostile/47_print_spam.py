# hostile: print megabytes (stdout is the protocol pipe)
# axis: scheduling
# gate: pass
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        print("x" * 1_000_000)
        return 0
