"""Opt-in: start the worker with the interpreter's code at the parent's virtual address (Linux).

Off by default (`load_sandboxed_policy(..., mirror_layout=True)` turns it on): it hands the
parent's library addresses to untrusted code (see "What it costs" below).

Why: a sandboxed run keeps the simulator and its worker on one CPU, taking turns
(client.WorkerProcess.session), and both run the same interpreter code. With ASLR the two
map libpython at different addresses, and branch predictors are indexed by virtual
address, so (most likely) every switch left the other process's predictions cold. Mapped
at the same address, a retention round trip on rtx70b_swe_0.1 drops from ~44 to ~35 us
(docs/sandbox.md#overhead).

How: with ADDR_NO_RANDOMIZE the kernel starts the mmap area a gap of RLIMIT_STACK (plus a
guard gap, at least 128 MiB) below the top of the address space, and the dynamic loader
maps ld.so and then the interpreter's library top-down from there: the library's address is
a fixed offset minus the stack limit. One probe child per process measures that offset, and
each worker starts with the stack limit that puts its library where the parent's is. The
personality is per thread and set only around the spawn; the stack limit is process-wide
for those microseconds (a process another thread spawns meanwhile gets a larger stack
limit, nothing else). The worker puts its stack limit back before loading the candidate;
the parent reads where its library landed from /proc (client.WorkerProcess.layout).

What it costs: the worker's layout is not randomised on its own. Its libraries sit where
the parent's do (random per parent process), its stack and heap at fixed addresses; a
candidate could learn the parent's library address (an object's default repr() or hash()
shows its address; on 3.11 hash(None) is in libpython's data). That helps
only an attack on a memory-safety bug in the parent reachable through the answer lines,
which the parent parses in Python. `mirror_layout=False` (client) turns it off.

Where it does nothing: an interpreter linked statically into its executable (the kernel
places an executable at a fixed address without ASLR), a kernel or container that refuses
the personality (Docker's default seccomp profile does), a hard stack limit too low, or
no /proc. The worker then starts as before, and `layout` says why.
"""
from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

ADDR_NO_RANDOMIZE = 0x0040000
QUERY = 0xFFFFFFFF
_PROBE_STACK = 1 << 30  # far above the kernel's 128 MiB minimum gap, so the offset is linear
_PROBE = "import sys; sys.stdout.write(open('/proc/self/maps').read())"  # the probe child's layout

_LOCK = threading.Lock()
_PLANS: dict[str, "Plan"] = {}


@dataclass(frozen=True)
class Plan:
    """Where the worker's interpreter library should land, or why it is left to ASLR."""
    lib: str | None = None    # path of the interpreter's shared library
    base: int | None = None   # its lowest mapped address in this process
    stack: int | None = None  # the RLIMIT_STACK soft limit that puts it there in a child
    why_not: str = ""


def _personality() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).personality
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_ulong]
    return fn


# libc's personality(2), or None where there is none. Public so a test can stand in a
# refusing one (as Docker's default seccomp profile refuses it) and see the fallback.
personality = _personality() if sys.platform.startswith("linux") else None


def lib_base(path: str, maps: str) -> int | None:
    """Lowest start address of the mappings of file `path` in a /proc/PID/maps text."""
    starts = [int(line.split("-", 1)[0], 16) for line in maps.splitlines()
              if line.split(None, 5)[5:] == [path]]
    return min(starts) if starts else None


def interpreter_lib() -> tuple[str | None, int | None, str]:
    """(path, base, "") of the file holding this interpreter's code, or (None, None, why)."""
    try:
        addr = ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            maps = fh.read()
    except (OSError, AttributeError, ValueError) as e:
        return None, None, f"no /proc/self/maps or C API ({type(e).__name__})"
    path = None
    for line in maps.splitlines():
        lo, _, rest = line.partition("-")
        hi = rest.split(None, 1)[0]
        if int(lo, 16) <= addr < int(hi, 16):
            parts = line.split(None, 5)
            path = parts[5] if len(parts) == 6 else None
            break
    if not path or not path.startswith("/"):
        return None, None, "the interpreter's code is not in a mapped file"
    if os.path.realpath(path) == os.path.realpath(sys.executable):
        return None, None, "the interpreter is linked into its executable, which the kernel places itself"
    return path, lib_base(path, maps), ""


def stack_soft_limit() -> int:
    """This process's own RLIMIT_STACK soft limit: read under the lock, since a spawn in
    another thread may have raised it for a moment."""
    with _LOCK:
        return resource.getrlimit(resource.RLIMIT_STACK)[0]


def _spawn_with(args: list[str], stack: int, kw: dict[str, Any]) -> subprocess.Popen | str:
    """Popen(args) with ADDR_NO_RANDOMIZE and RLIMIT_STACK=stack, or the reason it can't."""
    if personality is None:
        return "no personality() here"
    with _LOCK:  # read and restored under the lock: another thread's spawn may be in between
        soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
        if hard != resource.RLIM_INFINITY and stack > hard:
            return f"hard stack limit {hard} is below the {stack} needed"
        old = personality(QUERY)
        if old == -1 or personality(old | ADDR_NO_RANDOMIZE) == -1:
            return f"personality(ADDR_NO_RANDOMIZE) refused (errno {ctypes.get_errno()})"
        try:
            try:
                resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))
            except (ValueError, OSError) as e:
                return f"setrlimit(RLIMIT_STACK) refused ({e})"
            try:
                return subprocess.Popen(args, **kw)
            finally:
                resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
        finally:
            personality(old)


def _probe(exe: str, path: str, base: int) -> Plan:
    """Start a child as a worker would be, see where it maps `path`, derive the stack limit."""
    try:
        child = _spawn_with([exe, "-S", "-s", "-E", "-c", _PROBE], _PROBE_STACK,
                            {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL,
                             "stdin": subprocess.DEVNULL, "close_fds": True})
    except OSError as e:  # the worker's own spawn will say what is wrong, if anything
        return Plan(why_not=f"the probe child could not start ({e.strerror or e})")
    if isinstance(child, str):
        return Plan(why_not=child)
    try:
        out, _ = child.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
    probe = lib_base(path, out.decode("utf-8", "replace"))
    if probe is None:
        return Plan(why_not="the probe child did not map the interpreter library")
    stack = _PROBE_STACK + probe - base  # the library moves down one byte per byte of stack limit
    if stack <= 0:
        return Plan(why_not="the parent's library lies above any child's")
    return Plan(path, base, stack)


def plan() -> Plan:
    """This process's plan (the probe runs once per process)."""
    exe = sys.executable
    p = _PLANS.get(exe)
    if p is None:
        path, base, why = interpreter_lib()
        p = _probe(exe, path, base) if path is not None and base is not None \
            else Plan(why_not=why or "interpreter library not found in /proc/self/maps")
        _PLANS[exe] = p
    return p


def landed(pid: int, p: Plan) -> str:
    """"mirrored" if process `pid` maps the interpreter library where `p` wanted it, else "off: why"."""
    if p.lib is None:
        return "off: " + p.why_not
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            got = lib_base(p.lib, fh.read())
    except OSError as e:
        return f"off: cannot read the worker's maps ({e.strerror})"
    if got == p.base:
        return "mirrored"
    why = ("the worker does not map the interpreter library" if got is None
           else f"the library landed at {got:#x}, not {p.base:#x}")
    # the kernel or loader places things otherwise than the probe showed: later workers keep
    # their own ASLR rather than give it up for nothing
    _PLANS[sys.executable] = Plan(why_not="an earlier worker did not land where planned: " + why)
    return "off: " + why


def forget_plans() -> None:
    """Probe again at the next spawn (tests)."""
    with _LOCK:
        _PLANS.clear()


def set_plan(p: Plan) -> None:
    """Use `p` for this interpreter's next spawns instead of probing (tests)."""
    with _LOCK:
        _PLANS[sys.executable] = p


def spawn(args: list[str], mirror: bool = False, **kw: Any) -> tuple[subprocess.Popen, Plan]:
    """Popen(args, **kw), with the interpreter's library at the parent's address if it can be."""
    if not mirror:
        return subprocess.Popen(args, **kw), Plan(why_not="not requested (mirror_layout=False, the default)")
    p = plan()
    if p.stack is not None:
        child = _spawn_with(args, p.stack, kw)
        if not isinstance(child, str):
            return child, p
        p = Plan(why_not=child)
    return subprocess.Popen(args, **kw), p
