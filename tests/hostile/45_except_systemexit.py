# hostile: catch SystemExit to survive shutdown
# axis: scheduling
# gate: reject 'except SystemExit'
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            return 0
        except (ValueError, SystemExit):
            return 1
