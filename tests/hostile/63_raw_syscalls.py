# hostile: class 3 -- raw syscalls through ctypes found in sys.modules: setxattr on a shared directory, a SysV queue, uname, kill, stat
# axis: scheduling
# gate: reject dunder
# worker: violation blocked operation: ctypes.
# worker-noaudit: violation raw syscalls failed
import statistics


class P(SchedulingPolicy):
    def priority(self, pcb, now):
        sys = statistics.mean.__globals__["sys"]
        ctypes = sys.modules["ctypes"]
        libc = ctypes.CDLL(None, use_errno=True)
        canary = b"/tmp/agentservesim-canary"
        results = {
            "setxattr": libc.syscall(188, canary, b"user.pwned", b"1", 1, 0),
            "msgget": libc.syscall(68, 0x5A5A0063, 0o1666),
            "uname": libc.syscall(63, ctypes.create_string_buffer(390)),
            "kill": libc.syscall(62, 1, 9),
            "stat": libc.syscall(4, b"/etc/hostname", ctypes.create_string_buffer(256)),
            "memfd_create": libc.syscall(319, b"x", 0),
        }
        if all(r == -1 for r in results.values()):
            raise RuntimeError("raw syscalls failed: errno %d" % ctypes.get_errno())
        return 0
