# hostile: gc.get_objects() via the worker's sys.modules to hunt for trace data
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation
# worker-noaudit: any
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            raise ValueError("x")
        except ValueError as e:
            f = e.__traceback__.tb_frame
        while "sys" not in f.f_globals:
            f = f.f_back
        g = f.f_globals
        gc = g["sys"].modules.get("gc") or g["sys"].modules["builtins"].__import__("gc")
        hits = [o for o in gc.get_objects() if isinstance(o, dict) and "output_tokens" in o]
        return len(hits)
