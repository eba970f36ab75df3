# hostile: class 6 -- the class is changed after its body runs, under a name built at run time: a parent predicting answers from the text would score another policy
# axis: scheduling
# gate: reject dunder
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb, now):
        return 0


def newest_first(self, pcb, now):
    return -int(pcb.arrival_s * 1000)


P.__class__.__setattr__(P, "pri" + "ority", newest_first)
