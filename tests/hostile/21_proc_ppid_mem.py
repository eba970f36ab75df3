# hostile: read the simulator's memory via /proc/<ppid>/mem
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: open
# worker-noaudit: violation
def _os_globals():
    # os._wrap_close.__init__.__globals__ is the os module's namespace
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
    raise ValueError("not found")


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        os = _os_globals()
        fd = os["open"]("/proc/%d/mem" % os["getppid"](), os["O_RDONLY"])
        return len(os["read"](fd, 16))
