# hostile: start threads through the worker's _thread module
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: object.__getattr__ tb_frame
# worker-noaudit: contained
class P(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            raise ValueError("x")
        except ValueError as e:
            f = e.__traceback__.tb_frame
        while "sys" not in f.f_globals:
            f = f.f_back
        g = f.f_globals
        th = g["sys"].modules["_thread"]
        for _ in range(1000):
            th.start_new_thread(lambda: None, ())
        return 0
