# hostile: swallow everything with a bare except
# axis: scheduling
# gate: reject bare 'except:'
# worker: violation deadline
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        while True:
            try:
                while True:
                    pass
            except:
                pass
