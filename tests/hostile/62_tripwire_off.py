# hostile: class 2 -- switch the audit tripwire off (its tables and state, reached through module globals), then escape
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: os.system
# worker-noaudit: violation PermissionError
import statistics


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        sys = statistics.mean.__globals__["sys"]
        for name, mod in list(sys.modules.items()):
            try:
                g = mod.__dict__
            except AttributeError:
                continue
            for key in ("_PREFIXES", "_LOAD_OK", "_FRAME_ATTRS", "_TRIPWIRE_PREFIXES"):
                if key in g:
                    g[key] = ()       # the tables the hook was built from
            if isinstance(g.get("state"), dict):
                g["state"]["mode"] = "off"
        os = sys.modules["os"]
        os.system("touch /tmp/agentservesim-canary/62")
        return os.open("/tmp/agentservesim-canary/62b", os.O_CREAT | os.O_WRONLY, 0o666)
