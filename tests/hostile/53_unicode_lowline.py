# hostile: a dunder spelt with unicode low lines (NFKC-normalised)
# axis: scheduling
# gate: reject dunder
# worker: ok
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        a︳︳class︳︳ = 1
        return a︳︳class︳︳
