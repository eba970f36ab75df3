# hostile: class 4 -- cross-evaluation memory: keep each program's observed output lengths in a SysV message queue for the next evaluation
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: ctypes.
# worker-noaudit: ok
import statistics

KEY = 0x5A5A0064


class P(SchedulingPolicy):
    def __init__(self):
        sys = statistics.mean.__globals__["sys"]
        self.ct = sys.modules["ctypes"]
        self.libc = self.ct.CDLL(None, use_errno=True)
        self.q = self.libc.syscall(68, KEY, 0o1666)          # msgget(KEY, IPC_CREAT | 0666)
        self.memory = {}
        buf = self.ct.create_string_buffer(64)
        while self.q >= 0 and self.libc.syscall(70, self.q, buf, 56, 0, 0o4000) > 0:  # msgrcv, IPC_NOWAIT
            pid, n = buf.raw[8:40].rstrip(b"\0").split(b":")
            self.memory[pid.decode()] = int(n)

    def priority(self, pcb, now):
        if self.q >= 0 and pcb.completed_output_tokens:
            msg = self.ct.create_string_buffer(b"\1\0\0\0\0\0\0\0" + b"%s:%d" % (pcb.program_id.encode(),
                                                                               pcb.completed_output_tokens[-1]))
            self.libc.syscall(69, self.q, msg, 40, 0o4000)  # msgsnd, IPC_NOWAIT
        return self.memory.get(pcb.program_id, 0) + (0 if self.q < 0 else 1)
