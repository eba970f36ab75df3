# hostile: class 1 -- dataclasses.make_dataclass with a run-time "__getattr__" (a general getattr), then exception -> traceback -> frames
# axis: scheduling
# gate: reject 'dataclasses.make_dataclass' is not available
# worker: violation blocked operation: object.__getattr__ tb_frame
# worker-noaudit: violation PermissionError
import dataclasses

D = "_" * 2


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            dataclasses.make_dataclass("Probe", [], namespace={D + "getattr" + D: lambda self, n: n})
        except AttributeError:
            pass  # not in the worker's dataclasses; with the gate off, dunders can be written out
        try:
            raise ValueError("x")
        except ValueError as e:
            f = e.__traceback__.tb_frame
        while f is not None and "os" not in f.f_globals:
            f = f.f_back
        os = f.f_globals["os"]
        return os.open("/tmp/agentservesim-canary/60", os.O_CREAT | os.O_WRONLY, 0o666)
