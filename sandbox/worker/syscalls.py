"""seccomp-BPF allow lists for the worker's three processes (classic BPF, no dependency).

An allow list: every syscall not named here fails with EPERM (so Python reports an OSError
the parent can turn into a reason); a foreign ABI (x32 on x86_64, or any other audit
architecture) kills the process. Arguments are checked where an allowed call could reach
outside the process: read only from fd 0 and write only to fd 1 (the pipes to the parent),
and no executable memory (mmap without PROT_EXEC; mprotect is not allowed at all).

What the serving worker needs once the candidate is loaded, measured with strace over
simulations of every axis (docs/sandbox.md prints the list): the two pipe calls, memory
management, the per-call timer (setitimer, whose SIGALRM ends a stuck call), and exit.
"""
from __future__ import annotations

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# Only the syscalls the allow lists name (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h).
NR = {
    AUDIT_ARCH_X86_64: dict(read=0, write=1, close=3, mmap=9, munmap=11, brk=12, rt_sigaction=13,
                            rt_sigprocmask=14, rt_sigreturn=15, mremap=25, madvise=28, setitimer=38,
                            getpid=39, exit=60, wait4=61, kill=62, restart_syscall=219, clock_gettime=228,
                            exit_group=231),
    AUDIT_ARCH_AARCH64: dict(read=63, write=64, close=57, mmap=222, munmap=215, brk=214, rt_sigaction=134,
                             rt_sigprocmask=135, rt_sigreturn=139, mremap=216, madvise=233, setitimer=103,
                             getpid=172, exit=93, wait4=260, kill=129, restart_syscall=128, clock_gettime=113,
                             exit_group=94),
}
MACHINES = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}

PROT_EXEC = 0x4
_MEMORY = {"mmap": ("noexec",), "munmap": (), "mremap": (), "brk": (), "madvise": ()}
_EXIT = {"exit": (), "exit_group": (), "rt_sigreturn": (), "restart_syscall": ()}
# name -> argument rule: () any arguments, ("fd", n) first argument == n, ("noexec",) third
# argument without PROT_EXEC.
ALLOW = {
    # the worker that runs the candidate: its pipes, memory, the per-call timer, exit
    "worker": {"read": ("fd", 0), "write": ("fd", 1), "setitimer": (), "clock_gettime": (), **_MEMORY, **_EXIT},
    # the outer process (outside the PID namespace): waits for the worker, then mirrors its end
    "keeper": {"wait4": (), "kill": (), "getpid": (), "rt_sigaction": (), "rt_sigprocmask": (), "close": (),
               **_MEMORY, **_EXIT},
    # PID 1 of the namespace: blocks on a pipe until the keeper is gone
    "init": {"read": (), **_MEMORY, **_EXIT},
}

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
EPERM = 1
RET_EPERM = 0x00050000 | EPERM
_OFF_NR, _OFF_ARCH = 0, 4


def _arg_lo(i: int) -> int:
    """Offset of the low 32 bits of args[i] in struct seccomp_data (little-endian)."""
    return 16 + 8 * i


def program(arch: int, role: str) -> list[tuple[int, int, int, int]]:
    """The filter for `role` as (code, jt, jf, k) instructions."""
    nrs = NR[arch]
    prog = [(_LD_W_ABS, 0, 0, _OFF_ARCH),
            (_JEQ_K, 1, 0, arch),
            (_RET_K, 0, 0, RET_KILL_PROCESS),      # a foreign ABI: kill
            (_LD_W_ABS, 0, 0, _OFF_NR)]
    if arch == AUDIT_ARCH_X86_64:                   # x32 syscalls alias the x86_64 ones
        prog += [(_JGE_K, 0, 1, X32_SYSCALL_BIT), (_RET_K, 0, 0, RET_KILL_PROCESS)]
    for name, rule in sorted(ALLOW[role].items(), key=lambda kv: nrs[kv[0]]):
        if not rule:
            prog += [(_JEQ_K, 0, 1, nrs[name]), (_RET_K, 0, 0, RET_ALLOW)]
        elif rule[0] == "fd":
            # not this syscall: skip the 4-instruction block (the accumulator still holds nr)
            prog += [(_JEQ_K, 0, 4, nrs[name]), (_LD_W_ABS, 0, 0, _arg_lo(0)),
                     (_JEQ_K, 0, 1, rule[1]), (_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, RET_EPERM)]
        elif rule[0] == "noexec":
            prog += [(_JEQ_K, 0, 4, nrs[name]), (_LD_W_ABS, 0, 0, _arg_lo(2)),
                     (_JSET_K, 1, 0, PROT_EXEC), (_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, RET_EPERM)]
        else:
            raise ValueError(f"unknown seccomp rule {rule!r}")
    prog.append((_RET_K, 0, 0, RET_EPERM))
    return prog


def describe(role: str) -> list[str]:
    """The allow list as text, for the docs and `evolve check`."""
    out = []
    for name, rule in ALLOW[role].items():
        if not rule:
            out.append(name)
        elif rule[0] == "fd":
            out.append(f"{name}(fd {rule[1]})")
        else:
            out.append(f"{name}(no PROT_EXEC)")
    return out


def install(ctypes, libc, arch: int, role: str) -> str:
    """no_new_privs + the filter for `role`; returns "" on success or why it is not active."""
    prog = program(arch, role)

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    arr = (SockFilter * len(prog))(*[SockFilter(*p) for p in prog])
    fprog = SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(SockFilter)))
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "prctl(NO_NEW_PRIVS) failed: errno %d" % ctypes.get_errno()
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return "prctl(SECCOMP) failed: errno %d" % ctypes.get_errno()
    return ""
