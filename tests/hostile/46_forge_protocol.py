# hostile: write forged answers straight into the protocol pipe
# axis: scheduling
# gate: reject dunder
# worker: any
# worker-noaudit: any
def _os_globals():
    # os._wrap_close.__init__.__globals__ is the os module's namespace
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
    raise ValueError("not found")


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        _os_globals()["write"](1, b"[1,0]\n[1,0]\n[1,0]\n")
        return 0
