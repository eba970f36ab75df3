# hostile: class 7 -- engine_args nested 1,000 deep (a RecursionError traceback in evolve check/simulate before)
# axis: scheduling
# gate: pass
# worker: violation loading failed
# worker-noaudit: violation loading failed
DEEP = {}
_d = DEEP
for _ in range(1000):
    _d["x"] = {}
    _d = _d["x"]


class P(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority", "extra": DEEP}

    def priority(self, pcb, now):
        return 0
