"""The kernel boundary: everything here happens before the first byte of candidate code runs.

Threat model (docs/sandbox.md): the candidate has arbitrary native code execution in the
worker from its first module-level statement. So no guarantee rests on Python; the kernel
enforces all of these, each reported as a layer ("on" / "off: why"):

  drop_root     a root parent's worker becomes nobody (65534): no root-owned file, no
                signal to another user's process, RLIMIT_NPROC applies
  userns pidns ipcns utsns netns mntns
                fresh namespaces: no process outside is visible or signalable (PID), no
                SysV object outside (IPC; the namespace dies with the worker, and every
                queue, segment and semaphore in it), host name "sandbox" (UTS), no network
                interface (net), and a mount table of its own (mount)
  fs_root       an empty, read-only tmpfs as / (pivot_root; the host tree is detached), so
                there is no path to anything
  caps          no capabilities in any set (bounding and ambient cleared, securebits locked)
  landlock      a Landlock domain handling every filesystem right, TCP bind/connect and
                (ABI >= 6) signals and abstract unix sockets outside it, with no rule: no
                access at all
  rlimits       address space, CPU seconds (SIGKILL at the budget), no file growth, no new
                descriptors, no processes, no core, no locked memory, no message queues
  pdeathsig     SIGKILL when the parent dies; the parent is re-checked after setting it
  undumpable    no core dump (a crash cannot hand its memory to a host crash handler), and
                /proc entries owned by root
  seccomp       an allow list (syscalls.py): read fd 0, write fd 1, memory without
                PROT_EXEC, the per-call timer, exit; everything else EPERM

Processes (a PID namespace's first process is its init, whose default-action signals the
kernel drops, so the candidate must not be it):

  keeper   the process the parent started; drops root, unshares, builds the empty root,
           then forks the two below. It stays outside the PID namespace, reports the
           worker's pid, closes the pipes, waits for the worker and ends as it ended (same
           signal or exit code), so the parent sees the worker's own end.
  init     PID 1 of the namespace; blocks on a pipe from the keeper and exits when the
           keeper is gone, which ends the namespace (the kernel kills all left in it).
  worker   PID 2: caps, rlimits, pdeathsig, Landlock, seccomp, then the candidate.

A layer the platform lacks is reported "off: why"; the parent refuses such a worker unless
weak sandboxes are allowed (sandbox/process.py). `cfg["unavailable"]` names layers to treat
as unavailable (tests use it to show that refusal), `cfg["disable"]` layers the caller
turned off on purpose (tests of one layer at a time).
"""
from __future__ import annotations

import os
import resource
import signal
import sys

from . import syscalls

NOBODY = 65534
CLONE = {"userns": 0x10000000, "mntns": 0x00020000, "pidns": 0x20000000, "ipcns": 0x08000000,
         "utsns": 0x04000000, "netns": 0x40000000}
NAMESPACES = tuple(CLONE)
# in report order
LAYERS = ("drop_root", *NAMESPACES, "fs_root", "caps", "landlock", "rlimits", "pdeathsig", "undumpable",
          "seccomp", "no_new_privs")

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 1, 4, 24, 28, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE and the locks of those and of KEEP_CAPS
SECUREBITS_LOCKED = 0b11101111
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 16384, 1 << 18
MNT_DETACH = 2
NR_PIVOT_ROOT = {syscalls.AUDIT_ARCH_X86_64: 155, syscalls.AUDIT_ARCH_AARCH64: 41}
NR_CAPSET = {syscalls.AUDIT_ARCH_X86_64: 126, syscalls.AUDIT_ARCH_AARCH64: 91}
NR_CAPGET = {syscalls.AUDIT_ARCH_X86_64: 125, syscalls.AUDIT_ARCH_AARCH64: 90}
NR_LANDLOCK_CREATE, NR_LANDLOCK_RESTRICT = 444, 446  # the same on every architecture
HOSTNAME = b"sandbox"


SIMULATED = "unavailable (simulated by the caller)"


class Layers(dict):
    def mark(self, name: str, ok: bool, why: str = "", detail: str = "") -> None:
        """`name` is on (with an optional detail) or off, with why."""
        if ok:
            self[name] = "on" + (f" ({detail})" if detail else "")
        else:
            self[name] = "off: " + (why or "unavailable")


class Host:
    """ctypes and libc, loaded before anything is locked down."""

    def __init__(self) -> None:
        import ctypes
        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.arch = syscalls.MACHINES.get(os.uname().machine)

    def errno(self) -> str:
        e = self.ctypes.get_errno()
        return "errno %d %s" % (e, os.strerror(e))

    def syscall(self, nr: int, *args) -> int:
        return self.libc.syscall(nr, *args)


def _ids_map(own: int) -> bytes:
    return b"%d %d 1" % (own, own)


def _write_proc(name: str, data: bytes) -> None:
    fd = os.open("/proc/self/" + name, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _no_nested_namespaces() -> str:
    """Limit every kind of namespace to 0 inside ours (per-user-namespace sysctls), so that
    even past seccomp the worker cannot make a user namespace and regain capabilities in it."""
    failed = []
    for kind in ("user", "mnt", "pid", "ipc", "uts", "net", "cgroup", "time"):
        try:
            fd = os.open("/proc/sys/user/max_%s_namespaces" % kind, os.O_WRONLY)
        except OSError:
            failed.append(kind)
            continue
        try:
            os.write(fd, b"0")
        except OSError:
            failed.append(kind)
        finally:
            os.close(fd)
    return "no nested namespaces" if not failed else "nested namespaces not limited: " + ", ".join(failed)


def _empty_root(h: Host, mount_point: str) -> str:
    """pivot_root into an empty read-only tmpfs mounted on `mount_point`; "" or why not."""
    libc = h.libc
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "making / private: " + h.errno()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"tmpfs", mount_point.encode(), b"tmpfs", flags, b"size=4k,nr_inodes=1,mode=0555") != 0:
        return "mounting the empty root: " + h.errno()
    os.chdir(mount_point)
    if h.arch is None or h.syscall(NR_PIVOT_ROOT[h.arch], b".", b".") != 0:
        return "pivot_root: " + (h.errno() if h.arch else "unknown architecture")
    if libc.umount2(b".", MNT_DETACH) != 0:
        return "detaching the host tree: " + h.errno()
    os.chdir("/")
    if libc.mount(None, b"/", None, MS_REMOUNT | MS_RDONLY | flags, None) != 0:
        return "remounting / read-only: " + h.errno()
    return ""


def isolate(cfg: dict) -> Layers:
    """Build the process tree and every layer; returns, in the worker process only, its layers.

    The keeper and init processes never return from here.
    """
    layers = Layers()
    off = set(cfg.get("unavailable") or ())
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not sys.platform.startswith("linux"):
        return _elsewhere(cfg, layers)
    h = Host()
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as fh:
            cap_last = int(fh.read())
    except (OSError, ValueError):
        cap_last = 63  # dropping a capability the kernel does not know fails harmlessly
    # Privileges first: the namespaces are then owned by nobody, not by root.
    if "drop_root" in off:
        layers.mark("drop_root", False, SIMULATED)
    elif os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            # setuid made us undumpable, which makes /proc/self root's: the id maps below
            # must be written by us (the worker is made undumpable again later)
            h.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            layers.mark("drop_root", True, detail="uid %d" % NOBODY)
        except OSError as e:
            layers.mark("drop_root", False, str(e))
    else:
        layers.mark("drop_root", True, detail="not root: uid %d" % os.getuid())
    uid, gid = os.getuid(), os.getgid()
    # Namespaces, all at once (the user namespace is created first and owns the others).
    want = [n for n in NAMESPACES if n not in off]
    flags = 0
    for n in want:
        flags |= CLONE[n]
    ns_ok = bool(want) and h.libc.unshare(flags) == 0
    why = "" if ns_ok else h.errno()
    for n in NAMESPACES:
        layers.mark(n, ns_ok and n not in off, SIMULATED if n in off else "unshare: " + why)
    if ns_ok and "userns" in want:
        try:
            _write_proc("setgroups", b"deny")
            _write_proc("gid_map", _ids_map(gid))
            _write_proc("uid_map", _ids_map(uid))
        except OSError as e:
            layers.mark("userns", False, "id maps: %s" % e)
        else:
            layers.mark("userns", True, detail=_no_nested_namespaces())
    if ns_ok and "utsns" in want:
        if h.libc.sethostname(HOSTNAME, len(HOSTNAME)) != 0 or h.libc.setdomainname(HOSTNAME, len(HOSTNAME)) != 0:
            layers.mark("utsns", False, "sethostname: " + h.errno())
    if "fs_root" in off:
        layers.mark("fs_root", False, SIMULATED)
    elif not layers["mntns"].startswith("on"):
        layers.mark("fs_root", False, "needs a mount namespace")
    else:
        why_not = _empty_root(h, cfg.get("mount_point") or os.getcwd())
        layers.mark("fs_root", not why_not, why_not, "empty read-only tmpfs")
    # The keeper dies with the parent; checked again after setting it (a race with its death).
    h.libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != cfg["ppid"]:
        os._exit(70)
    keeper = os.getpid()
    in_pidns = layers["pidns"].startswith("on")
    lifeline_r, lifeline_w = os.pipe()
    init = 0
    if in_pidns:
        init = os.fork()
        if init == 0:
            _init(h, lifeline_r, lifeline_w, cap_last)
    worker = os.fork()
    if worker == 0:
        os.close(lifeline_r)
        os.close(lifeline_w)
        _finish(cfg, h, layers, off, cap_last, parent=0 if in_pidns else keeper)
        return layers
    os.close(lifeline_r)
    _keep(h, worker, init, cap_last)
    raise AssertionError("unreachable")


def _drop_caps(h: Host, cap_last: int) -> bool:
    """Clear every capability set; True when effective, permitted and inheritable are empty."""
    ct, libc = h.ctypes, h.libc
    libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED, 0, 0, 0)  # needs CAP_SETPCAP: before dropping
    for cap in range(cap_last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if h.arch is None:
        return False
    header = (ct.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ct.c_uint32 * 6)()                 # {effective, permitted, inheritable} x 2 words, all 0
    h.syscall(NR_CAPSET[h.arch], header, data)
    got = (ct.c_uint32 * 6)(*([0xFFFFFFFF] * 6))
    if h.syscall(NR_CAPGET[h.arch], header, got) != 0:
        return False
    return not any(got)


def _seccomp(h: Host, role: str) -> str:
    if h.arch is None:
        return "no syscall table for " + os.uname().machine
    return syscalls.install(h.ctypes, h.libc, h.arch, role)


def _shed(h: Host, cap_last: int, role: str) -> None:
    """What the namespace's helper processes (init, keeper) give up before they wait: the standard
    streams, every capability, and all syscalls but their role's few. They run no candidate code,
    so a seccomp failure here is not fatal (the worker's own filter is)."""
    for fd in (0, 1, 2):
        os.close(fd)
    _drop_caps(h, cap_last)
    _seccomp(h, role)


def _init(h: Host, lifeline_r: int, lifeline_w: int, cap_last: int) -> None:
    """PID 1 of the namespace: wait until the keeper is gone, then end the namespace."""
    try:
        os.close(lifeline_w)
        _shed(h, cap_last, "init")
        while True:
            try:
                if not os.read(lifeline_r, 1):
                    break
            except InterruptedError:
                continue
    finally:
        os._exit(0)


def _keep(h: Host, worker: int, init: int, cap_last: int) -> None:
    """The keeper: report the worker's pid, let go of the pipes, wait, end as the worker did."""
    try:
        os.write(1, b"[2,%d]\n" % worker)
        _shed(h, cap_last, "keeper")
        while True:
            try:
                _, status = os.waitpid(worker, 0)
                break
            except InterruptedError:
                continue
        if init:
            # the lifeline would end it too; this is sooner, and reaping it here leaves no
            # zombie for the host's init to collect
            os.kill(init, signal.SIGKILL)
            os.waitpid(init, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            except (OSError, ValueError):
                pass
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.waitstatus_to_exitcode(status))
    finally:
        os._exit(71)


def _finish(cfg: dict, h: Host, layers: Layers, off: set, cap_last: int, parent: int) -> None:
    """The worker's own layers, in an order where each step still has what it needs."""
    libc, ct = h.libc, h.ctypes
    # No core dump, and /proc/<pid> owned by root from here on.
    if "undumpable" in off:
        layers.mark("undumpable", False, SIMULATED)
    else:
        layers.mark("undumpable", libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0, "prctl: " + h.errno())
    if "caps" in off:
        layers.mark("caps", False, SIMULATED)
    else:
        layers.mark("caps", _drop_caps(h, cap_last), "capabilities remain after capset")
    # Parent death: set after the credential changes above, which may clear it.
    ok = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if os.getppid() != parent:
        os._exit(70)  # the keeper is already gone
    if "pdeathsig" in off:
        layers.mark("pdeathsig", False, SIMULATED)
    else:
        layers.mark("pdeathsig", ok, "prctl: " + h.errno())
    # Landlock: a domain with no rule, so no filesystem access, no TCP, no signal out.
    if "landlock" in off:
        layers.mark("landlock", False, SIMULATED)
    else:
        ok, detail = _landlock(h)
        layers.mark("landlock", ok, detail, detail)
    # rlimits (the kernel enforces them from outside the interpreter)
    failed = []
    cpu = int(cfg["cpu_s"])
    limits = [("RLIMIT_AS", cfg["mem_bytes"]), ("RLIMIT_CPU", cpu), ("RLIMIT_FSIZE", 0), ("RLIMIT_NOFILE", 3),
              ("RLIMIT_NPROC", 0), ("RLIMIT_CORE", 0), ("RLIMIT_MEMLOCK", 0), ("RLIMIT_MSGQUEUE", 0)]
    for name, value in limits:
        # soft == hard: RLIMIT_CPU then sends SIGKILL at the budget (no SIGXCPU to ignore)
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError, AttributeError) as e:
            failed.append("%s (%s)" % (name, e))
    if cfg.get("stack_soft") is not None:
        # sandbox/layout.py may have started us with a huge stack limit to place our
        # libraries; the candidate gets the parent's own limit back
        try:
            resource.setrlimit(resource.RLIMIT_STACK,
                               (cfg["stack_soft"], resource.getrlimit(resource.RLIMIT_STACK)[1]))
        except (ValueError, OSError) as e:
            failed.append("RLIMIT_STACK (%s)" % e)
    if "rlimits" in off:
        layers.mark("rlimits", False, SIMULATED)
    else:
        layers.mark("rlimits", not failed, "failed: " + ", ".join(failed))
    # Only the pipes to the parent stay open.
    os.closerange(3, 1 << 16)
    # no_new_privs (Landlock set it already; seccomp needs it): no privilege through exec
    PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 38, 39
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    layers.mark("no_new_privs", libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1, "not set: " + h.errno())
    # seccomp last: after it, prctl and everything else outside the allow list is EPERM
    if "seccomp" in (cfg.get("disable") or ()):
        layers.mark("seccomp", False, "disabled by the caller")
    elif "seccomp" in off:
        layers.mark("seccomp", False, SIMULATED)
    else:
        why_not = _seccomp(h, "worker")
        layers.mark("seccomp", not why_not, why_not, "allow list of %d syscalls" % len(syscalls.ALLOW["worker"]))
    del ct


def _landlock(h: Host) -> tuple[bool, str]:
    ct = h.ctypes
    abi = h.syscall(NR_LANDLOCK_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return False, "not supported by this kernel (%s)" % h.errno()
    fs = (1 << 13) - 1                      # ABI 1: execute ... make_sym
    if abi >= 2:
        fs |= 1 << 13                       # refer
    if abi >= 3:
        fs |= 1 << 14                       # truncate
    if abi >= 5:
        fs |= 1 << 15                       # ioctl_dev
    net = 0b11 if abi >= 4 else 0           # bind_tcp, connect_tcp
    scoped = 0b11 if abi >= 6 else 0        # abstract unix sockets, signals
    attr = (ct.c_uint64 * 3)(fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    fd = h.syscall(NR_LANDLOCK_CREATE, attr, size, 0)
    if fd < 0:
        return False, "landlock_create_ruleset: " + h.errno()
    h.libc.prctl(38, 1, 0, 0, 0)  # no_new_privs: required to restrict oneself without CAP_SYS_ADMIN
    ok = h.syscall(NR_LANDLOCK_RESTRICT, fd, 0) == 0
    why = "" if ok else "landlock_restrict_self: " + h.errno()
    os.close(fd)
    what = ["filesystem"] + (["TCP"] if net else []) + (["signals", "abstract sockets"] if scoped else [])
    return ok, (why or "ABI %d: %s" % (abi, ", ".join(what)))


def _elsewhere(cfg: dict, layers: Layers) -> Layers:
    """Not Linux: none of the kernel layers exist; only rlimits. The parent refuses such a
    worker unless weak sandboxes are allowed. Same process tree shape: keeper and worker."""
    for name in LAYERS:
        layers.mark(name, False, "not Linux")
    worker = os.fork()
    if worker:
        os.write(1, b"[2,%d]\n" % worker)
        for fd in (0, 1, 2):
            os.close(fd)
        _, status = os.waitpid(worker, 0)
        os._exit(os.waitstatus_to_exitcode(status) % 256)
    failed = []
    for name, value in (("RLIMIT_AS", cfg["mem_bytes"]), ("RLIMIT_CPU", int(cfg["cpu_s"])), ("RLIMIT_FSIZE", 0),
                        ("RLIMIT_NPROC", 0), ("RLIMIT_CORE", 0)):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError, AttributeError) as e:
            failed.append("%s (%s)" % (name, e))
    layers.mark("rlimits", not failed, "failed: " + ", ".join(failed))
    return layers
