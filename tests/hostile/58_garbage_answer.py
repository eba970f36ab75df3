# hostile: write a line that is not JSON before the real answer
# axis: scheduling
# gate: reject dunder
# worker: violation malformed answer
# worker-noaudit: violation
def _os_globals():
    # os._wrap_close.__init__.__globals__ is the os module's namespace
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
    raise ValueError("not found")


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        _os_globals()["write"](1, b"{not json\n")
        return 0
