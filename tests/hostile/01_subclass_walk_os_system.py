# hostile: walk object.__subclasses__() to os._wrap_close, then os.system
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: os.system
# worker-noaudit: contained
def _os_globals():
    # os._wrap_close.__init__.__globals__ is the os module's namespace
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
    raise ValueError("not found")


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        return _os_globals()["system"]("touch /tmp/agentservesim-canary/01")
