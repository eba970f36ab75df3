# hostile: swallow the kill with except BaseException
# axis: scheduling
# gate: reject 'except BaseException'
# worker: violation deadline
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
