"""The isolated worker: runs one candidate policy behind a pipe.

This file is self-contained on purpose. The parent (`sandbox.client`) reads its *source*
and starts `python -s -S -P -B -c <source> <config-json>` (-I's isolation, with an
environment holding only a fixed PYTHONHASHSEED), so the worker imports nothing of the
simulator: its address space never holds a trace, a PCB or a simulator object, and no
frame walk or `gc` trick can reach future data. Observations arrive as plain data of the
allow-listed fields only; decisions leave as JSON. Never pickle.

Start-up order matters (each step is a layer; see docs/sandbox.md):
  1. pre-import the allow-listed modules (nothing can be imported later);
  2. drop root to nobody, unshare a user + network namespace (no network interfaces);
  3. rlimits: address space, CPU seconds, file size 0, few descriptors, no processes;
  4. parent-death signal (set last: credential changes clear it), parent pid check;
  5. no_new_privs + a seccomp filter denying sockets, fork/exec, open, ptrace, kill...;
  6. an audit hook as a tripwire that ends the worker on any sensitive event.
Then the candidate is compiled with restricted builtins and a restricted `__import__`.

Protocol. Parent -> worker: frames of a 4-byte little-endian length + a `marshal` dump of
plain data (str/int/float/bool/None/list/tuple/dict); the parent is trusted and marshal is
5x faster than json here. Worker -> parent: one JSON value per line, because the parent
must parse what untrusted code produced (never pickle, never marshal, in that direction).
  parent -> {"source", "axis", "wire"}                   worker -> [1, info] | [0, reason]
  parent -> [call, ...], call = [hook, now, pcb_row, extra, signals|None]
                                                         worker -> [1, value] | [0, reason]
One frame per round trip: the last call is waited for; calls before it are *posted* (hook
"A": on_turn_arrival whose answer the parent knows, extra = that answer) and get no line
unless they fail. Hooks: "c" (on_turn_complete, extra = request_id), "a" (on_turn_arrival),
"p" (priority), "s" (select, extra = instance rows), "y" (sync: [1,0]); signals None =
unchanged. Rows carry only the fields named by "wire" (select_fields: those the candidate's
source can read).
"""
import gc
import json
import marshal
from _collections import _tuplegetter
import os
import signal
import sys

# --------------------------------------------------------------------------- observations
# Field order of the PCB view, shared with the parent; tests check it equals
# simcore.pcb.OBSERVABLE_PCB_FIELDS (the allow-list), so nothing else can be sent.
VIEW_FIELDS = (
    "program_id", "arrival_s", "turn_index", "turns_completed", "attained_service_s",
    "context_tokens", "last_instance", "kv_resident", "kv_resident_tokens", "kv_protected",
    "protect_until", "kv_tier", "tool_name", "gap_started_s", "release_s",
    "returned_tool_durations", "returned_tool_names", "completed_output_tokens",
    "completed_prompt_tokens",
)
TUPLE_FIELDS = ("returned_tool_durations", "returned_tool_names", "completed_output_tokens",
                "completed_prompt_tokens")
INSTANCE_FIELDS = ("index", "running", "waiting", "kv_utilization", "free_tokens", "holds_program_kv")
SIGNAL_FIELDS = ("now", "kv_utilization", "instances")

MAX_REPLY_BYTES = 1 << 16
ALLOWED_MODULES = ("math", "heapq", "bisect", "collections", "itertools", "functools",
                   "statistics", "dataclasses", "enum")
# `from typing import X` only for these names (annotations); `import typing` is refused.
TYPING_NAMES = ("Any", "Optional", "Union", "Dict", "List", "Tuple", "Set", "FrozenSet",
                "Iterable", "Iterator", "Sequence", "Mapping", "MutableMapping", "ClassVar",
                "Callable", "DefaultDict", "Deque", "NamedTuple")
POLICY_IMPORT_MODULES = ("simcore.policies", "simcore.policies.base")
POLICY_IMPORT_NAMES = ("RetentionPolicy", "SchedulingPolicy", "RoutingPolicy",
                       "ProgramView", "Signals", "InstanceView")

SAFE_BUILTIN_NAMES = (
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "classmethod",
    "complex", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "hash", "hex",
    "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
    "object", "oct", "ord", "pow", "property", "range", "repr", "reversed", "round", "set",
    "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "zip",
    "ArithmeticError", "AssertionError", "AttributeError", "Exception", "IndexError",
    "KeyError", "LookupError", "NotImplementedError", "OverflowError", "RuntimeError",
    "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
    "NotImplemented", "Ellipsis", "True", "False", "None",
)


def public_api(module):
    """Names of a module a candidate may use: public, and not themselves modules.

    `dataclasses.builtins`, `statistics.random`, `enum.sys` ... are modules reachable as
    attributes; handing them out would undo the import allow-list.
    """
    out = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if type(value) is type(sys):
            continue
        out[name] = value
    return out


class _View(tuple):
    """Base of the rebuilt views: an immutable tuple with named, read-only fields.

    It behaves like simcore's frozen dataclasses, not like a tuple: a policy that indexes,
    iterates or measures a view would work here and fail in-process (or in vLLM), so those
    are refused. Field access goes through tuple.__getitem__ directly.
    """
    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError("observations are read-only")

    def __getitem__(self, i):
        raise TypeError("'%s' object is not subscriptable" % type(self).__name__)

    def __iter__(self):
        raise TypeError("'%s' object is not iterable" % type(self).__name__)

    def __len__(self):
        raise TypeError("object of type '%s' has no len()" % type(self).__name__)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (f, tuple.__getitem__(self, i)) for i, f in enumerate(self._fields)))


def _make_view_class(name, fields, extra=None):
    ns = {"__slots__": (), "_fields": fields}
    for i, f in enumerate(fields):
        # namedtuple's C field descriptor: reads slot i directly (not through the refused
        # __getitem__), refuses assignment, and costs no Python frame per field read
        ns[f] = _tuplegetter(i, None)
    ns.update(extra or {})
    return type(name, (_View,), ns)


def _gap_elapsed_s(self, now):
    """Seconds since the last call completed (the tool gap so far), if any."""
    g = self.gap_started_s
    if g is None:
        return None
    return max(0.0, now - g)


def _inflight(self):
    return self.running + self.waiting


# Derived members and the fields they read.
_VIEW_METHODS = {"gap_elapsed_s": (_gap_elapsed_s, ("gap_started_s",))}
_INSTANCE_METHODS = {"inflight": (property(_inflight), ("running", "waiting"))}


def select_fields(names=None):
    """The fields to send for a candidate whose source names the attributes `names`.

    The gate refuses getattr, vars, dunders and string formatting, so a candidate can read an
    observation field only as `x.field` with the name written in its source: sending the
    other fields could not change a decision, and costs encoding on both sides of the pipe.
    None sends everything. program_id is always sent (the history deltas are keyed by it).
    """
    def want(field, methods):
        return names is None or field in names or any(
            m in names and field in deps for m, (_, deps) in methods.items())
    view = [f for f in VIEW_FIELDS if f == "program_id" or want(f, _VIEW_METHODS)]
    inst = [f for f in INSTANCE_FIELDS if want(f, _INSTANCE_METHODS)]
    signals = [f for f in SIGNAL_FIELDS if want(f, {})] if names is None or "signals" in names else None
    return {"view": [f for f in view if f not in TUPLE_FIELDS],
            "hist": [f for f in view if f in TUPLE_FIELDS], "inst": inst, "signals": signals}


def configure(wire):
    """(Re)build the view classes for the fields `wire` (select_fields' result) sends."""
    global ProgramView, InstanceView, Signals, WIRE, N_SCALAR, N_HIST
    if set(wire["view"]) - set(VIEW_FIELDS) or set(wire["hist"]) - set(TUPLE_FIELDS) \
            or set(wire["inst"]) - set(INSTANCE_FIELDS) or set(wire["signals"] or ()) - set(SIGNAL_FIELDS) \
            or not wire["view"] or wire["view"][0] != "program_id":
        raise ValueError("protocol: unknown observation fields")
    fields = tuple(wire["view"]) + tuple(wire["hist"])
    ProgramView = _make_view_class("ProgramView", fields, {
        m: fn for m, (fn, deps) in _VIEW_METHODS.items() if set(deps) <= set(fields)})
    InstanceView = _make_view_class("InstanceView", tuple(wire["inst"]), {
        m: fn for m, (fn, deps) in _INSTANCE_METHODS.items() if set(deps) <= set(wire["inst"])})
    Signals = _make_view_class("Signals", tuple(wire["signals"] or ()))
    WIRE = wire
    N_SCALAR = len(wire["view"])
    N_HIST = len(wire["hist"])
    _POLICY_NAMES.update(ProgramView=ProgramView, InstanceView=InstanceView, Signals=Signals)


_POLICY_NAMES = {}
configure(select_fields())
# The history tuples only grow, so the parent sends each as (start, new items) against
# what it sent last time for that program; the full tuples live here.
_HISTORY = {}


def make_view(row):
    """Rebuild a view from [scalars, (start, items) per history field] (see the client's encoder)."""
    if not N_HIST:
        return tuple.__new__(ProgramView, row)
    pid = row[0]
    hist = _HISTORY.get(pid)
    if hist is None:
        hist = _HISTORY[pid] = [()] * N_HIST
    vals = list(row[:N_SCALAR])
    for j in range(N_HIST):
        start = row[N_SCALAR + 2 * j]
        items = row[N_SCALAR + 2 * j + 1]
        cur = hist[j]
        if start != len(cur):
            if start > len(cur):
                raise ValueError("protocol: history out of step")
            cur = cur[:start]
        if items:
            cur = cur + tuple(items)
        hist[j] = cur
        vals.append(cur)
    return tuple.__new__(ProgramView, vals)


def make_instances(rows):
    return tuple(tuple.__new__(InstanceView, r) for r in rows)


def make_signals(row):
    """[now?, kv_utilization?, instance rows?] in SIGNAL_FIELDS order, the fields WIRE sends."""
    if WIRE["signals"] and WIRE["signals"][-1] == "instances":
        row = row[:-1] + [make_instances(row[-1])]
    return tuple.__new__(Signals, row)


# --------------------------------------------------------------------------- base classes
# Mirrors of simcore.policies.base (defaults included; a test keeps them in sync).
class _Policy:
    name = ""
    axis = ""
    engine_args = {}

    def __init__(self):
        pass

    def bind(self, signals):
        object.__setattr__(self, "signals", signals)


class RetentionPolicy(_Policy):
    axis = "retention"

    def on_turn_complete(self, pcb, request_id, now):
        return "release"

    def on_turn_arrival(self, pcb, now):
        return None


class SchedulingPolicy(_Policy):
    axis = "scheduling"
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb, now):
        return 0


class RoutingPolicy(_Policy):
    axis = "routing"

    def select(self, pcb, inflight, now):
        return 0


BASES = {"retention": RetentionPolicy, "scheduling": SchedulingPolicy, "routing": RoutingPolicy}


# --------------------------------------------------------------------------- hardening
class _Layers(dict):
    def mark(self, name, ok, why=""):
        self[name] = "on" if ok else ("off: " + why if why else "off")


def _libc():
    import ctypes
    return ctypes, ctypes.CDLL(None, use_errno=True)


# Syscalls the worker never needs once the candidate is loaded. Denied with EPERM (not a
# kill) so that Python reports an OSError the parent can turn into a reason.
_DENY = ("socket connect accept accept4 sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg "
         "shutdown bind listen getsockname getpeername socketpair setsockopt getsockopt "
         "clone clone3 fork vfork execve execveat kill tkill tgkill ptrace process_vm_readv "
         "process_vm_writev open openat openat2 creat link linkat unlink unlinkat rename "
         "renameat renameat2 mkdir mkdirat rmdir symlink symlinkat chmod fchmodat chown lchown "
         "fchownat truncate mknod mknodat mount umount2 chroot pivot_root setns unshare bpf "
         "perf_event_open keyctl add_key request_key prctl personality userfaultfd "
         "io_uring_setup io_uring_enter io_uring_register memfd_create reboot kexec_load "
         "kexec_file_load init_module finit_module delete_module swapon swapoff sethostname "
         "setdomainname settimeofday clock_settime acct quotactl pidfd_open pidfd_getfd "
         "pidfd_send_signal open_by_handle_at name_to_handle_at fanotify_init inotify_init "
         "inotify_init1 setuid setgid setreuid setresuid setgroups ioperm iopl move_mount "
         "fsopen fsmount open_tree").split()
_NR = {
    # x86_64: asm/unistd_64.h
    0xC000003E: dict(socket=41, connect=42, accept=43, sendto=44, recvfrom=45, sendmsg=46,
                     recvmsg=47, shutdown=48, bind=49, listen=50, getsockname=51, getpeername=52,
                     socketpair=53, setsockopt=54, getsockopt=55, accept4=288, recvmmsg=299,
                     sendmmsg=307, clone=56, fork=57, vfork=58, execve=59, execveat=322,
                     clone3=435, kill=62, tkill=200, tgkill=234, ptrace=101, process_vm_readv=310,
                     process_vm_writev=311, open=2, openat=257, openat2=437, creat=85, link=86,
                     unlink=87, rename=82, mkdir=83, rmdir=84, chmod=90, chown=92, lchown=94,
                     fchownat=260, symlink=88, unlinkat=263, renameat=264, renameat2=316,
                     mkdirat=258, linkat=265, symlinkat=266, fchmodat=268, truncate=76,
                     mount=165, umount2=166, chroot=161, pivot_root=155, setns=308,
                     unshare=272, bpf=321, perf_event_open=298, keyctl=250, add_key=248,
                     request_key=249, prctl=157, personality=135, userfaultfd=323,
                     io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
                     memfd_create=319, mknod=133, mknodat=259, reboot=169, kexec_load=246,
                     kexec_file_load=320, init_module=175, finit_module=313, delete_module=176,
                     swapon=167, swapoff=168, sethostname=170, setdomainname=171,
                     settimeofday=164, clock_settime=227, acct=163, quotactl=179,
                     pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424,
                     open_by_handle_at=304, name_to_handle_at=303, fanotify_init=300,
                     inotify_init=253, inotify_init1=294, setuid=105, setgid=106,
                     setreuid=113, setresuid=117, setgroups=116, ioperm=173, iopl=172,
                     move_mount=429, fsopen=430, fsmount=432, open_tree=428),
    # aarch64: asm-generic/unistd.h (no legacy open/fork/... entry points)
    0xC00000B7: dict(socket=198, connect=203, accept=202, sendto=206, recvfrom=207,
                     sendmsg=211, recvmsg=212, shutdown=210, bind=200, listen=201,
                     getsockname=204, getpeername=205, socketpair=199, setsockopt=208,
                     getsockopt=209, accept4=242, recvmmsg=243, sendmmsg=269, clone=220,
                     execve=221, execveat=281, clone3=435, kill=129, tkill=130, tgkill=131,
                     ptrace=117, process_vm_readv=270, process_vm_writev=271, openat=56,
                     openat2=437, unlinkat=35, renameat=38, renameat2=276, mkdirat=34,
                     linkat=37, symlinkat=36, fchmodat=53, fchownat=54, truncate=45, mount=40,
                     umount2=39, chroot=51, pivot_root=41, setns=268, unshare=97, bpf=280,
                     perf_event_open=241, keyctl=219, add_key=217, request_key=218, prctl=167,
                     personality=92, userfaultfd=282, io_uring_setup=425, io_uring_enter=426,
                     io_uring_register=427, memfd_create=279, mknodat=33, reboot=142,
                     kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273,
                     delete_module=106, swapon=224, swapoff=225, sethostname=161,
                     setdomainname=162, settimeofday=170, clock_settime=112, acct=89,
                     quotactl=60, pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424,
                     open_by_handle_at=265, name_to_handle_at=264, fanotify_init=262,
                     inotify_init1=26, setuid=146, setgid=144, setreuid=145, setresuid=147,
                     setgroups=159, move_mount=429, fsopen=430, fsmount=432, open_tree=428),
}


def _machine_arch():
    m = os.uname().machine
    return {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(m)


def _install_seccomp(ctypes, libc):
    """A classic-BPF deny list; returns "" on success or why it is not active."""
    arch = _machine_arch()
    if arch is None:
        return "no syscall table for " + os.uname().machine
    nrs = sorted(set(_NR[arch][n] for n in _DENY if n in _NR[arch]))

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
    ALLOW, ERRNO, KILL = 0x7FFF0000, 0x00050000, 0x80000000  # KILL = kill the whole process
    EPERM = 1
    prog = [(LD_W_ABS, 0, 0, 4),                        # seccomp_data.arch
            (JEQ_K, 1, 0, arch),
            (RET_K, 0, 0, KILL),                        # a foreign ABI: refuse outright
            (LD_W_ABS, 0, 0, 0)]                        # seccomp_data.nr
    if arch == 0xC000003E:                              # x32 syscalls alias the x86_64 ones
        prog.append((JGE_K, 0, 1, 0x40000000))
        prog.append((RET_K, 0, 0, ERRNO | EPERM))
    n = len(nrs)
    for i, nr in enumerate(nrs):
        # on match jump to the deny return, which sits right after the allow return
        prog.append((JEQ_K, n - i, 0, nr))
    prog.append((RET_K, 0, 0, ALLOW))
    prog.append((RET_K, 0, 0, ERRNO | EPERM))
    arr = (SockFilter * len(prog))(*[SockFilter(*p) for p in prog])
    fprog = SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(SockFilter)))
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "prctl(NO_NEW_PRIVS) failed: errno %d" % ctypes.get_errno()
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return "prctl(SECCOMP) failed: errno %d" % ctypes.get_errno()
    return ""


def harden(cfg):
    """Apply every isolation layer the machine allows; returns {layer: "on" | "off: why"}.

    Each layer is independent: one the platform lacks (no prctl on macOS, no user
    namespaces in some containers) is reported "off" and the others still apply.
    """
    import resource
    import signal
    layers = _Layers()
    try:
        ctypes, libc = _libc()
        libc.prctl, libc.unshare  # noqa: B018 - both exist on Linux only
    except (OSError, AttributeError, ImportError) as e:
        ctypes = libc = None
        why = "no Linux libc (%s)" % type(e).__name__
    # Privileges: a root worker would be exempt from RLIMIT_NPROC and could read any file.
    if os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            layers.mark("drop_root", True)
        except OSError as e:
            layers.mark("drop_root", False, str(e))
    else:
        layers.mark("drop_root", True)
    # Namespaces: a fresh network namespace has no interfaces, so no network at all.
    CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
    if libc is None:
        layers.mark("netns", False, why)
    elif libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        layers.mark("netns", True)
    else:
        layers.mark("netns", False, "unshare errno %d" % ctypes.get_errno())
    # rlimits (the kernel enforces these from outside the interpreter).
    failed = []
    for name, soft, hard in (("RLIMIT_AS", cfg["mem_bytes"], cfg["mem_bytes"]),
                             ("RLIMIT_CPU", cfg["cpu_s"], cfg["cpu_s"] + 1),
                             ("RLIMIT_FSIZE", 0, 0), ("RLIMIT_NOFILE", 8, 8),
                             ("RLIMIT_NPROC", 0, 0), ("RLIMIT_CORE", 0, 0)):
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
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
    layers.mark("rlimits", not failed, "failed: " + ", ".join(failed))
    # Parent death: set after the credential changes above, which clear it.
    PR_SET_PDEATHSIG = 1
    if libc is None:
        layers.mark("pdeathsig", False, why)
    else:
        layers.mark("pdeathsig", libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)
    if os.getppid() != cfg["ppid"]:
        os._exit(70)  # the parent is already gone
    if not cfg.get("seccomp", True):
        layers.mark("seccomp", False, "disabled by caller")
    elif libc is None:
        layers.mark("seccomp", False, why)
    else:
        why_not = _install_seccomp(ctypes, libc)
        layers.mark("seccomp", not why_not, why_not)
    # ctypes stays loaded (the import system holds it), but unnamed: the candidate's
    # namespace never reaches sys.modules without a dunder walk, which the gate refuses.
    for m in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")]:
        del sys.modules[m]
    return layers


# Audit events that only an escape attempt can raise once the candidate is loaded.
_TRIPWIRE_PREFIXES = ("open", "os.", "subprocess.", "socket.", "ctypes.", "sys._getframe",
                      "sys._current_frames", "gc.", "import", "compile", "exec",
                      "pickle.", "shutil.", "urllib.", "http.", "_thread.", "code.__new__",
                      "function.__new__", "sys.setprofile", "sys.settrace", "builtins.input",
                      "pty.", "resource.", "signal.",
                      "syslog.", "mmap.", "fcntl.", "sqlite3.", "webbrowser", "ftplib.",
                      "smtplib.", "telnetlib.", "poplib.", "imaplib.", "nntplib.", "glob.",
                      "tempfile.", "socket", "sys.unraisablehook", "sys.excepthook")


# compile/exec: the candidate itself, dataclass and namedtuple code generation; _getframe:
# namedtuple and enum read their caller's module name
_LOAD_OK = ("compile", "exec", "sys._getframe")


def _send(obj):
    data = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode() + b"\n"
    while data:
        n = os.write(1, data)
        data = data[n:]


def install_tripwire(state):
    """An audit hook: any sensitive event ends the worker with a reason (can't be caught)."""
    def hook(event, args):
        if event == "marshal.loads":  # every frame from the parent: keep the common case short
            return
        mode = state["mode"]
        if mode == "off" or (mode == "load" and event in _LOAD_OK):
            return
        if event.startswith(_TRIPWIRE_PREFIXES):
            try:
                _send([0, "blocked operation: " + event])
            finally:
                os._exit(3)
    sys.addaudithook(hook)


# --------------------------------------------------------------------------- candidate
class _Module:
    """A read-only stand-in for an allow-listed module (public, non-module names only)."""
    __slots__ = ("_ns",)

    def __init__(self, ns):
        object.__setattr__(self, "_ns", ns)

    def __getattr__(self, name):
        ns = object.__getattribute__(self, "_ns")
        if name in ns:
            return ns[name]
        raise AttributeError("module has no attribute " + repr(name) + " (or it is not allowed)")

    def __setattr__(self, name, value):
        raise AttributeError("modules are read-only in the sandbox")


def build_namespace():
    import importlib
    import unicodedata  # noqa: F401 - the compiler imports it for non-ASCII identifiers
    mods = {m: _Module(public_api(importlib.import_module(m))) for m in ALLOWED_MODULES}
    typing = importlib.import_module("typing")
    mods["typing"] = _Module({n: getattr(typing, n) for n in TYPING_NAMES})
    future = importlib.import_module("__future__")
    mods["__future__"] = _Module({"annotations": future.annotations})
    _POLICY_NAMES.update(RetentionPolicy=RetentionPolicy, SchedulingPolicy=SchedulingPolicy,
                         RoutingPolicy=RoutingPolicy)
    policy_mod = _Module(_POLICY_NAMES)  # the same dict: configure() swaps the view classes
    for m in POLICY_IMPORT_MODULES:
        mods[m] = policy_mod

    def restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in mods:
            raise ImportError("import of '%s' is not allowed in a policy" % name)
        if name in ("typing", "__future__") or name in POLICY_IMPORT_MODULES:
            if not fromlist:
                raise ImportError("use 'from %s import ...' for '%s'" % (name, name))
        return mods[name]

    import builtins
    safe = {n: getattr(builtins, n) for n in SAFE_BUILTIN_NAMES}
    safe["__build_class__"] = builtins.__build_class__
    safe["__import__"] = restricted_import
    safe["print"] = lambda *a, **k: None  # stdout is the protocol pipe
    ns = {"__builtins__": safe, "__name__": "candidate_policy", "math": mods["math"]}
    ns.update(_POLICY_NAMES)
    return ns


def _reason(exc):
    msg = str(exc).replace("\n", " ")
    if len(msg) > 300:
        msg = msg[:300] + "..."
    return type(exc).__name__ + (": " + msg if msg else "")


def load_candidate(source, axis, ns):
    """Exec the candidate and instantiate its one policy class for `axis`."""
    base = BASES[axis]
    code = compile(source, "<candidate>", "exec", dont_inherit=True)
    exec(code, ns)  # noqa: S102 - restricted namespace, isolated process
    found = [v for k, v in ns.items()
             if isinstance(v, type) and issubclass(v, _Policy) and v not in BASES.values()
             and v.__module__ == "candidate_policy"]
    mine = [c for c in found if issubclass(c, base)]
    if len(mine) != 1:
        raise ValueError("expected exactly one %s subclass, found %d" % (base.__name__, len(mine)))
    cls = mine[0]
    policy = cls()
    ea = getattr(cls, "engine_args", {})
    if not isinstance(ea, dict):
        raise ValueError("engine_args must be a dict")
    name = getattr(cls, "name", "") or cls.__name__
    return policy, {"class": cls.__name__, "name": str(name), "engine_args": ea}


class FrameReader:
    """Parent -> worker frames off fd 0, read with os.read."""

    def __init__(self, fd=0):
        self.fd = fd
        self.buf = bytearray()

    def next(self):
        """The next frame's data, blocking for it; None at end of input."""
        if not self.buf:  # the usual case: one read brings exactly one frame
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            if len(chunk) >= 4 and len(chunk) == 4 + int.from_bytes(chunk[:4], "little"):
                return marshal.loads(memoryview(chunk)[4:])
            self.buf += chunk
        while len(self.buf) < 4 or len(self.buf) < 4 + int.from_bytes(self.buf[:4], "little"):
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        n = int.from_bytes(self.buf[:4], "little")
        body = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        return marshal.loads(body)


def _answer(value, encode):
    """The answer line for a hook's return value: [1, value] as JSON."""
    # ints (every priority, every route) skip the encoder; "%d" obeys the same int-to-str
    # digit limit as json does
    t = type(value)
    if t is int:
        return "[1,%d]\n" % value
    if t is str and value in _SIMPLE_ANSWERS:
        return _SIMPLE_ANSWERS[value]
    if t is tuple and len(value) == 2 and type(value[0]) is str and type(value[1]) is float \
            and value[0] == "protect" and value[1] - value[1] == 0.0:
        return '[1,["protect",%r]]\n' % value[1]  # repr of a finite float is its JSON
    return encode([1, value]) + "\n"


def _norm(v):
    """JSON brings tuples back as lists."""
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return v


def serve(policy, axis, state, frames):
    """Answer frames of calls until the parent closes the pipe; one write per frame.

    A frame is a list of calls: the last one waited for, any before it *posted*. A posted
    call's hook letter is upper-case and its answer is already known to the parent (sent as
    `extra`, see sandbox.gate.hook_answers): nothing is written for it unless it fails or
    answers otherwise, and then that failure line comes first and the parent stops at it.
    Hook "y" is a sync point, answered [1,0].
    """
    encode = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode
    signals = None
    # Locals for the hot loop: each global or call costs several times its warm price here,
    # because the parent has just run on this CPU (see docs/sandbox.md#overhead).
    new = tuple.__new__
    setattr_ = object.__setattr__
    plain_bind = type(policy).bind is _Policy.bind
    view_cls, sig_cls, flat = ProgramView, Signals, not N_HIST
    flat_sig = not (WIRE["signals"] and WIRE["signals"][-1] == "instances")
    write = os.write
    # A frame of many calls (deferred priorities, posted calls) has one deadline in the parent,
    # decision_s per call; here each call also gets its own, so a stuck call ends the worker
    # (SIGALRM's default action) within decision_s, as a lone call would.
    alarm, real, decision_s = signal.setitimer, signal.ITIMER_REAL, state.get("decision_s", 0)
    while True:
        calls = frames.next()
        if calls is None:
            return
        answers = []
        timed = decision_s > 0 and len(calls) > 2
        for hook, now, row, extra, sig in calls:
            if timed:
                alarm(real, decision_s)
            if hook == "y":
                answers.append("[1,0]\n")
                continue
            if sig is not None:
                signals = new(sig_cls, sig) if flat_sig else make_signals(sig)
            out = None
            try:
                # the simulator binds fresh signals before every hook; a policy that does not
                # override bind() gets the same assignment without a Python frame
                if plain_bind:
                    setattr_(policy, "signals", signals)
                else:
                    policy.bind(signals)
                view = new(view_cls, row) if flat else make_view(row)
                if hook == "p":
                    out = _answer(policy.priority(view, now), encode)
                elif hook == "c":
                    out = _answer(policy.on_turn_complete(view, extra, now), encode)
                elif hook == "A":
                    value = policy.on_turn_arrival(view, now)
                    if value != extra:
                        got = json.loads(encode(value))
                        if _norm(got) != _norm(extra):
                            out = json.dumps([0, "on_turn_arrival returned %r, but its code can only return %r"
                                              % (got, extra)]) + "\n"
                elif hook == "a":
                    out = _answer(policy.on_turn_arrival(view, now), encode)
                else:
                    out = _answer(policy.select(view, make_instances(extra), now), encode)
            except Exception as e:  # noqa: BLE001 - every failure becomes a one-line reason
                out = json.dumps([0, "%s raised %s" % (_HOOK_NAMES.get(hook, "hook"), _reason(e))]) + "\n"
            if out is not None:
                if len(out) > MAX_REPLY_BYTES:
                    out = json.dumps([0, "%s returned a value larger than %d bytes"
                                      % (_HOOK_NAMES[hook], MAX_REPLY_BYTES)]) + "\n"
                answers.append(out)
                if out[1] == "0":
                    break  # the parent stops at the first failure
        if timed:
            alarm(real, 0)
        data = (answers[0] if len(answers) == 1 else "".join(answers)).encode()
        while data:
            data = data[write(1, data):]


_SIMPLE_ANSWERS = {v: '[1,"%s"]\n' % v for v in ("release", "evict", "offload", "none")}
_HOOK_NAMES = {"c": "on_turn_complete", "a": "on_turn_arrival", "A": "on_turn_arrival", "p": "priority",
               "s": "select", "y": "sync"}


def main():
    cfg = json.loads(sys.argv[1])
    # Everything importable is imported now; afterwards `open` is refused by seccomp.
    ns = build_namespace()
    layers = harden(cfg)
    state = {"mode": "off", "decision_s": float(cfg.get("decision_s", 0))}
    if cfg.get("audit", True):
        install_tripwire(state)
        layers.mark("audit_tripwire", True)
    else:
        layers.mark("audit_tripwire", False, "disabled by caller")
    frames = FrameReader()
    msg = frames.next()
    if not isinstance(msg, dict):
        return
    try:
        # While loading, compiling the candidate (and dataclass code generation) is fine.
        state["mode"] = "load"
        configure(msg.get("wire") or select_fields())
        ns.update(_POLICY_NAMES)
        policy, info = load_candidate(msg["source"], msg["axis"], ns)
        json.dumps(info)
    except Exception as e:  # noqa: BLE001
        _send([0, "loading failed: " + _reason(e)])
        return
    state["mode"] = "serve"
    # Everything alive now (modules, the candidate's code) lives as long as the worker: keep
    # the cyclic collector from walking it again and again (each walk evicts the parent's
    # caches on the shared CPU); the candidate's own garbage is still collected.
    gc.collect()
    gc.freeze()
    info["layers"] = dict(layers)
    _send([1, info])
    serve(policy, msg["axis"], state, frames)


if __name__ == "__main__":
    main()
