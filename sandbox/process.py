"""The worker process as the parent sees it: spawn, check its isolation, deadlines, lifecycle.

`WorkerProcess(source, axis)` starts the worker (sandbox/worker/), reads the layer report it
writes before any candidate code exists, checks what it can of that report from outside
(/proc), refuses a worker that lacks a layer unless weak sandboxes are allowed, then sends
the source. Hook calls travel as marshal frames and come back as JSON lines (sandbox/wire.py);
every failure -- a rule broken, a deadline or budget overrun, an exception in the
candidate, a malformed answer -- raises `SandboxViolation` with a one-line reason and kills
the worker's process group.
"""
from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from functools import lru_cache
from typing import Any

from simcore.pcb import observation_schema
from simcore.policies import base as policy_base
from simcore.policies.registry import CANDIDATE_MODULE, policy_namespace

from . import cpus, layout, policy_api, wire
from .errors import SandboxUnavailable, SandboxViolation
from .text import safe_text
from .wire import (FAST_ANSWER, HOOK_NAMES, MAX_REPLY_BYTES, SIMPLE_ANSWERS, Failed, Malformed, ViewEncoder,
                   parse_answer)

DEFAULT_DECISION_TIMEOUT_S = 1.0
DEFAULT_CPU_BUDGET_S = 60.0
DEFAULT_MEMORY_MB = 1024
LOAD_TIMEOUT_S = 15.0
MAX_PIPELINED = 256   # queued calls before they are sent anyway

# Layers every worker must have (sandbox/worker/harden.py), plus the tripwire (serve.py).
REQUIRED_LAYERS = ("drop_root", "userns", "pidns", "ipcns", "utsns", "netns", "mntns", "fs_root", "caps",
                   "landlock", "rlimits", "pdeathsig", "undumpable", "seccomp", "no_new_privs", "audit_tripwire")
DISABLED = "off: disabled by the caller"
WEAK_HINT = ("pass --allow-weak-sandbox (allow_weak_sandbox=True from Python) to run candidates with only the "
             "layers this machine has")

_WORKER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker")
# Imports the worker's modules as a package of their own ("asw"), not as `sandbox.worker`,
# so that nothing of the simulator or the rest of `sandbox` is loaded in the worker.
_BOOTSTRAP = ("import sys, types; p = types.ModuleType('asw'); p.__path__ = [sys.argv[1]]; "
              "sys.modules['asw'] = p; from asw import serve; serve.main(sys.argv[2])")
_LIVE: "weakref.WeakSet[WorkerProcess]" = weakref.WeakSet()
_loads = json.loads


def _getcpu_fn() -> Any:
    """libc sched_getcpu (a vDSO call, ~50 ns), or None where unavailable."""
    try:
        import ctypes
        fn = ctypes.CDLL(None).sched_getcpu
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return fn if fn() >= 0 else None
    except (OSError, AttributeError):
        return None


getcpu = _getcpu_fn()


@lru_cache(maxsize=1)
def worker_config() -> dict[str, Any]:
    """What every worker is told at start-up, all derived from the one definition of each:
    the observation schema (simcore.pcb), the policy base classes (simcore.policies.base),
    the import allow-list (sandbox.policy_api), the globals a policy file sees in-process
    (simcore.policies.registry)."""
    roots = [policy_base._Policy, *policy_base.AXIS_BASES.values()]
    return {"api": policy_api.as_wire(), "schema": observation_schema(),
            "bases": {"module": policy_base.__name__, "root": roots[0].__name__,
                      "names": [c.__name__ for c in roots],
                      "source": "\n\n".join(inspect.getsource(c) for c in roots)},
            "axis_bases": {a: c.__name__ for a, c in policy_base.AXIS_BASES.items()},
            "globals": sorted(policy_namespace()), "module_name": CANDIDATE_MODULE, "filename": "<candidate>",
            "hooks": HOOK_NAMES}


def _proc_text(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _status_fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = v.strip()
    return out


def verify_layers(pid: int, layers: dict[str, str]) -> dict[str, str]:
    """The worker's report, checked from outside where /proc shows it; a layer reported on but
    not found is turned off, with what was seen. (Landlock, pdeathsig and the tripwire have
    no outside view; the report is written before any candidate code exists.)"""
    out = dict(layers)

    def on(name: str) -> bool:
        return out.get(name, "").startswith("on")

    def contradict(name: str, seen: str) -> None:
        if on(name):
            out[name] = f"off: reported on, but {seen}"

    status = _proc_text(pid, "status")
    if status is None:
        return {k: (v if not v.startswith("on") else f"off: cannot read /proc/{pid}/status") for k, v in out.items()}
    st = _status_fields(status)
    if st.get("Seccomp") != "2":
        contradict("seccomp", f"/proc status has Seccomp {st.get('Seccomp')}")
    if st.get("NoNewPrivs") != "1":
        contradict("no_new_privs", f"/proc status has NoNewPrivs {st.get('NoNewPrivs')}")
    for k in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        if st.get(k, "0").strip("0"):
            contradict("caps", f"/proc status has {k} {st.get(k)}")
    if os.geteuid() == 0 and set(st.get("Uid", "").split()) != {"65534"}:
        contradict("drop_root", f"/proc status has Uid {st.get('Uid')}")
    if len(st.get("NSpid", "").split()) < 2:
        contradict("pidns", f"/proc status has NSpid {st.get('NSpid')}")
    for ns in ("user", "ipc", "uts", "net", "mnt"):
        try:
            if os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}"):
                contradict(f"{ns}ns", f"/proc/{pid}/ns/{ns} is this process's namespace")
        except OSError:
            pass  # not ours to read (an unprivileged parent and an undumpable worker)
    try:
        if os.listdir(f"/proc/{pid}/root"):
            contradict("fs_root", f"/proc/{pid}/root is not empty")
        elif not os.statvfs(f"/proc/{pid}/root").f_flag & os.ST_RDONLY:
            contradict("fs_root", f"/proc/{pid}/root is writable")
    except OSError:
        pass
    limits = _proc_text(pid, "limits") or ""
    for label in ("Max processes", "Max file size"):
        row = next((line for line in limits.splitlines() if line.startswith(label)), "")
        if row[len(label):].split()[:2] != ["0", "0"]:
            contradict("rlimits", f"/proc limits show {label} {' '.join(row[len(label):].split()[:2])}")
    return out


def _missing(layers: dict[str, str]) -> list[str]:
    """Required layers that are off for a reason other than the caller's own choice."""
    return [f"{k} ({layers.get(k, 'off: not reported')[5:] or 'off'})" for k in REQUIRED_LAYERS
            if not layers.get(k, "").startswith("on") and layers.get(k) != DISABLED]


class Deadline(Exception):
    """No complete line before the deadline."""


class Closed(Exception):
    """The other end closed the pipe (the worker is gone)."""


class TooLarge(Exception):
    """A line longer than MAX_REPLY_BYTES."""


def cpu_ns(pid: int) -> int | None:
    """CPU time a process has run, in ns (/proc/PID/schedstat), or None where unreadable."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read().split(None, 1)[0])
    except (OSError, ValueError, IndexError):
        return None


class Allowance:
    """A deadline in the worker's CPU time, with a wall-clock cap.

    A decision deadline is there to stop a candidate that computes too long. On a loaded
    machine a worker may also be starved of the CPU, and a wall-clock deadline would then
    stop a candidate for the machine's load (a test that flakes, a search that scores by
    luck). So when the wall deadline passes, the worker is stopped only if it used its
    allowance of CPU since the parent started waiting; otherwise the wait goes on, until
    the cap (WALL_CAP x the allowance, at least 2 s more). The worker can do nothing but
    compute or wait for the parent (seccomp: no sleep, no futex, no poll), so a worker that
    neither answers nor computes is stopped at the cap. Where /proc is unreadable, the wall
    deadline is the deadline.
    """
    WALL_CAP = 10.0

    def __init__(self, pid: int, seconds: float, deadline: float, per: float | None = None) -> None:
        self.pid, self.seconds, self.deadline = pid, seconds, deadline
        self.per = seconds if per is None else per  # the limit as the user set it (per decision)
        self.cap = deadline + max((self.WALL_CAP - 1.0) * seconds, 2.0)
        self.cpu0: int | None = None

    def start(self) -> None:
        """The parent begins to wait: the CPU the worker uses from here is counted."""
        if self.cpu0 is None:
            self.cpu0 = cpu_ns(self.pid)

    def extend(self) -> bool:
        """The wall deadline passed: True (and a later deadline) if the worker was starved."""
        now = time.monotonic()
        cpu = cpu_ns(self.pid) if self.cpu0 is not None else None
        if cpu is None or now >= self.cap:
            return False
        used = (cpu - self.cpu0) / 1e9
        if used >= 0.95 * self.seconds:
            return False
        self.deadline = min(self.cap, now + max(self.seconds - used, 0.01))
        return True


class LineReader:
    """Lines off a non-blocking pipe, read before polling: the worker usually ran while the
    parent wrote, so its answer is already waiting and no poll() syscall is needed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self.polls = 0  # how often it had to wait (tests)

    def read_line(self, deadline: float, waiting: Any = None) -> bytes:
        """The next line without its newline; raises Deadline, Closed or TooLarge.
        `waiting()` is called once, when the line is not there yet and polling begins."""
        buf = self.buf
        if not buf:  # the usual case: one read brings exactly one line
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk is not None:
                if not chunk:
                    raise Closed()
                if chunk.find(b"\n") == len(chunk) - 1:
                    return chunk[:-1]
                buf += chunk
        while True:
            i = buf.find(b"\n")
            if i >= 0:
                line = bytes(buf[:i])
                del buf[:i + 1]
                return line
            if len(buf) > MAX_REPLY_BYTES:
                raise TooLarge()
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                if waiting is not None:
                    waiting()
                    waiting = None
                left = deadline - time.monotonic()
                self.polls += 1
                if left <= 0 or not self._poll.poll(left * 1000.0):
                    raise Deadline() from None
                continue
            if not chunk:
                raise Closed()
            buf += chunk


class WorkerProcess:
    """One isolated worker holding one candidate; marshal frames out, JSON lines back."""

    def __init__(self, source: str, axis: str, *, decision_timeout_s: float = DEFAULT_DECISION_TIMEOUT_S,
                 cpu_budget_s: float = DEFAULT_CPU_BUDGET_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 load_timeout_s: float = LOAD_TIMEOUT_S, seccomp: bool = True, audit: bool = True,
                 wire_fields: dict[str, Any] | None = None, mirror_layout: bool = False,
                 allow_weak_sandbox: bool = False, simulate_unavailable: tuple[str, ...] = (),
                 native_payload: bool = False) -> None:
        if not (decision_timeout_s > 0 and math.isfinite(decision_timeout_s)):
            raise ValueError(f"decision_timeout_s must be a positive number, got {decision_timeout_s}")
        if not (cpu_budget_s > 0 and math.isfinite(cpu_budget_s)):
            raise ValueError(f"cpu_budget_s must be a positive number, got {cpu_budget_s}")
        self.axis = axis
        self.decision_timeout_s = float(decision_timeout_s)
        self.cpu_budget_s = float(cpu_budget_s)
        self.allow_weak_sandbox = bool(allow_weak_sandbox)
        self.dead: str | None = None
        self.calls = 0   # hook calls sent
        self.frames = 0  # round trips (a frame carries one or more calls)
        self.pid = -1    # the worker process (its parent, the keeper, is self.proc)
        self._last_sig: Any = None
        self._cpu = -1
        self.pinned = False  # True inside session(): parent thread and worker share one CPU
        self.enc = ViewEncoder(wire_fields)
        self._wired_signals = self.enc.wire["signals"] is not None  # the candidate reads self.signals
        self._outbox: list[tuple] = []  # deferred calls not sent yet
        self._ready: list = []          # answers of deferred calls sent already
        self.layers: dict[str, str] = {}
        self._cwd = tempfile.mkdtemp(prefix="agentservesim-sandbox-")
        os.chmod(self._cwd, 0o555)  # the mount point of the worker's empty root; empty here too
        disable = [n for n, on in (("seccomp", seccomp), ("audit", audit)) if not on]
        cfg = {**worker_config(), "ppid": os.getpid(), "cpu_s": max(1, math.ceil(cpu_budget_s)),
               "decision_s": self.decision_timeout_s, "mem_bytes": int(memory_mb) << 20,
               "stack_soft": layout.stack_soft_limit(), "disable": disable,
               "unavailable": list(simulate_unavailable), "native": bool(native_payload),
               "mount_point": self._cwd}
        # `-E -s -P` (what -I means) except -E: the environment is ours and empty but for a
        # fixed hash seed, so set/dict order of strings -- and so the decisions -- are the same
        # in every worker (the leakage check and the search compare runs). -S: no site dir.
        self.proc, plan = layout.spawn(
            [sys.executable, "-s", "-S", "-P", "-B", "-c", _BOOTSTRAP, _WORKER_DIR, json.dumps(cfg)], mirror_layout,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self._cwd, start_new_session=True, close_fds=True, env={"PYTHONHASHSEED": "0"})
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        self.reader = LineReader(self._in)
        self._poll_out = select.poll()
        self._poll_out.register(self._out, select.POLLOUT)
        _LIVE.add(self)
        self._pids: list[int] = []  # the worker's, once known: _reap waits for it to be gone
        self._finalizer = weakref.finalize(self, WorkerProcess._reap, self.proc, self._cwd, self._pids)
        allowance = Allowance(self.proc.pid, load_timeout_s, time.monotonic() + load_timeout_s)
        self._start(allowance)
        allowance.pid, allowance.cpu0 = self.pid, None  # from here the worker's own CPU counts
        self._send(wire.frame({"source": source, "axis": axis, "wire": self.enc.wire}), allowance,
                   "loading the policy")
        ok, info = self._line(allowance, "loading the policy", max_depth=3)
        if ok != 1 or not isinstance(info, dict):
            self._fail(str(info) if isinstance(info, str) else "worker sent a malformed load reply")
        self.info: dict[str, Any] = {"class": safe_text(info.get("class", ""), 200),
                                     "name": safe_text(info.get("name", ""), 200),
                                     "engine_args": info.get("engine_args", {})}
        self.layout = layout.landed(self.proc.pid, plan)  # "mirrored" or "off: why" (a speed matter)

    def _start(self, allowance: Allowance) -> None:
        """Read the keeper's pid line and the worker's layer report (either order), check the
        report, and refuse a weak sandbox unless allowed. Nothing of the candidate exists yet."""
        what = "starting the sandbox"
        reported: dict[str, str] | None = None
        while self.pid < 0 or reported is None:
            ok, value = self._line(allowance, what, max_depth=2)
            if ok == 2 and type(value) is int and value > 0 and self.pid < 0:
                self.pid = value
                self._pids.append(value)
            elif ok == 3 and isinstance(value, dict) and reported is None:
                reported = {safe_text(k, 40): safe_text(v, 200) for k, v in value.items()}
            elif ok == 0:
                self._fail(f"the sandbox could not start: {value}")
            else:
                self._fail("the sandbox sent a malformed start-up line")
        self.layers = verify_layers(self.pid, reported) if sys.platform.startswith("linux") else reported
        missing = _missing(self.layers)
        if missing and not self.allow_weak_sandbox:
            self.kill()
            self.dead = "refused: weak sandbox"
            raise SandboxUnavailable(f"sandbox layers unavailable on this machine: {'; '.join(missing)}. "
                                     f"Candidate code is not run without them; {WEAK_HINT}")

    # ----------------------------------------------------------------- transport
    def _fail(self, reason: str) -> None:
        self.kill()
        if self.dead is None:
            self.dead = reason
        raise SandboxViolation(reason)

    def _wait_keeper(self, timeout_s: float) -> tuple[int | None, float | None]:
        """(exit code as Popen reports it, CPU seconds of the keeper and the worker it reaped)."""
        end = time.monotonic() + timeout_s
        while True:
            try:
                pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                return self.proc.returncode, None
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode, ru.ru_utime + ru.ru_stime
            if time.monotonic() > end:
                self.kill()
                end = math.inf
            time.sleep(0.005)

    def _exit_reason(self, what: str) -> str:
        rc, cpu = self._wait_keeper(2.0)
        budget = math.ceil(self.cpu_budget_s)
        # RLIMIT_CPU (soft == hard) ends the worker with SIGKILL at the budget; rusage is
        # tick-sampled and may read a little under the kernel's precise count
        if rc == -signal.SIGKILL and cpu is not None and cpu >= 0.9 * budget - 0.05:
            return f"exceeded its CPU budget of {self.cpu_budget_s:g} s while {what}"
        if rc == -signal.SIGXCPU:
            return f"exceeded its CPU budget of {self.cpu_budget_s:g} s while {what}"
        if rc == -signal.SIGPROF:  # the worker's own per-call deadline (CPU time) in a frame of many calls
            return f"decision deadline of {self.decision_timeout_s:g} s exceeded while {what}"
        if rc == -signal.SIGSYS:
            return f"made a forbidden system call while {what}"
        if rc is not None and rc < 0:
            return f"worker was killed by signal {signal.Signals(-rc).name} while {what}"
        return f"worker exited unexpectedly (code {rc}) while {what}"

    def _roundtrip(self, call: tuple | None, what: str) -> Any:
        """Send the deferred calls, then `call`, as one frame and return `call`'s answer
        (with `call` None: only the deferred ones; their answers go to `self._ready`)."""
        if self.dead is not None:
            raise SandboxViolation(f"policy worker is stopped: {self.dead}")
        calls = self._outbox
        if call is None:
            if not calls:
                return None
            what = HOOK_NAMES[calls[-1][0]]
        if calls:  # deferred calls travel with this one: one frame, one wakeup
            queued = len(calls)
            if call is not None:
                calls.append(call)
            self._outbox = []
            what = f"{what} (one of {len(calls)} calls sent together)"
        else:
            queued = 0
            calls = (call,)
        answers = self._exchange(calls, what)
        if queued:
            self._ready.extend(answers[:queued])
        return answers[-1] if call is not None else None

    def _exchange(self, calls: Any, what: str) -> list:
        """Send `calls` as one frame and read one answer per call.

        The usual case runs inline -- one write takes the frame, and the worker, which ran
        during it on this CPU, has left exactly the answers -- because every Python call
        here costs several times its warm price (the worker has just had the CPU). Anything
        else goes through _send/_recv with the deadline (per call in the frame).
        """
        self.frames += 1
        msg = wire.frame(calls)
        n = len(calls)
        timeout_s = self.decision_timeout_s
        try:
            sent = os.write(self._out, msg)
        except (BlockingIOError, BrokenPipeError):
            sent = 0
        if sent == len(msg) and not self.reader.buf:
            try:
                data = os.read(self._in, 1 << 16)
            except BlockingIOError:
                data = None
            if data:
                if data[-1] == 10 and data.count(b"\n") == n:
                    if n == 1:
                        m = FAST_ANSWER(data, 0, len(data) - 1)
                        if m is not None and m.lastindex != 1:  # the commonest: retention answers
                            return [SIMPLE_ANSWERS[m.group(2)] if m.lastindex == 2
                                    else ["protect", float(m.group(3))]]
                        return [self._parse(data[:-1], what)]
                    return [self._parse(x, what) for x in data[:-1].split(b"\n")]
                self.reader.buf += data
            elif data is not None:  # end of file: the worker is gone
                self._fail(self._exit_reason(what))
        allowance = Allowance(self.pid, timeout_s * n, time.monotonic() + timeout_s * n, per=timeout_s)
        if sent != len(msg):
            self._send(msg[sent:], allowance, what)
        return [self._recv(allowance, what) for _ in range(n)]

    def flush(self) -> None:
        """Run every deferred call now; raises on the first failure."""
        if self._outbox and self.dead is None:
            self._roundtrip(None, "")

    def queue(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any) -> None:
        """Queue a call whose answer is wanted later: collect() returns the answers in order."""
        if self.dead is not None:
            raise SandboxViolation(f"policy worker is stopped: {self.dead}")
        self._outbox.append(self._message(hook, now, pcb, extra, signals))
        if len(self._outbox) >= MAX_PIPELINED:
            self.flush()  # bounded frames; the answers wait in self._ready

    def collect(self) -> list:
        """The raw answers of every queued call so far, in order (one round trip at most)."""
        self.flush()
        out, self._ready = self._ready, []
        return out

    @staticmethod
    def _deadline_reason(allowance: Allowance, what: str) -> str:
        return f"decision deadline of {allowance.per:g} s exceeded while {what}"

    def _send(self, msg: bytes, allowance: Allowance, what: str) -> None:
        view = memoryview(msg)
        allowance.start()
        while view:
            try:
                n = os.write(self._out, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except BrokenPipeError:
                self._fail(self._exit_reason(what))
            left = allowance.deadline - time.monotonic()
            if (left <= 0 or not self._poll_out.poll(left * 1000.0)) and not allowance.extend():
                self._fail(self._deadline_reason(allowance, what))

    def _read_line(self, allowance: Allowance, what: str) -> bytes:
        while True:
            try:
                return self.reader.read_line(allowance.deadline, allowance.start)
            except Deadline:
                if not allowance.extend():
                    self._fail(self._deadline_reason(allowance, what))
            except Closed:
                self._fail(self._exit_reason(what))
            except TooLarge:
                self._fail(f"answer larger than {MAX_REPLY_BYTES} bytes while {what}")

    def _recv(self, allowance: Allowance, what: str) -> Any:
        return self._parse(self._read_line(allowance, what), what)

    def _line(self, allowance: Allowance, what: str, max_depth: int) -> tuple[int, Any]:
        """A start-up or load line: [tag, value] with tag 0..3."""
        line = self._read_line(allowance, what)
        try:
            msg = _loads(line)
            if type(msg) is not list or len(msg) != 2 or type(msg[0]) is not int or wire._too_deep(msg[1], max_depth):
                raise ValueError
        except (ValueError, RecursionError, MemoryError):
            self._fail(f"worker sent a malformed line while {what}")
        return msg[0], msg[1]

    def _parse(self, line: bytes, what: str) -> Any:
        """One answer line -> the value; a failure line or a malformed one fails the worker."""
        try:
            return parse_answer(line)
        except Failed as e:
            self._fail(str(e) or f"policy failed while {what}")
        except Malformed as e:
            self._fail(f"worker sent a malformed answer ({e}) while {what}")

    def call(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any) -> Any:
        """One hook call; returns the raw JSON-decoded value (validated by the caller)."""
        return self._roundtrip(self._message(hook, now, pcb, extra, signals), HOOK_NAMES[hook])

    def _message(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any) -> tuple:
        """One call as plain data: (hook, now, view row, extra, signals row or None if unchanged)."""
        sig = None
        if signals is not self._last_sig and self._wired_signals:  # else: unchanged, or never read
            sig = self.enc.signals(signals, now)
            self._last_sig = signals
        self.calls += 1
        if not self.pinned and getcpu is not None:
            # Keep the worker on the CPU the parent runs on: the two never run at the same
            # time (each waits for the other), and a same-CPU wakeup avoids waking an idle
            # core, which costs ~100 us per call on small VMs.
            cpu = getcpu()
            if cpu != self._cpu:
                self._cpu = cpu
                try:
                    os.sched_setaffinity(self.pid, (cpu,))
                except OSError:
                    pass
        return (hook, now if type(now) is float else wire.plain(now), self.enc.view(pcb), extra, sig)

    @contextlib.contextmanager
    def session(self) -> Any:
        """One simulation: pin the calling thread and the worker to one free CPU (sandbox.cpus),
        and on the way out run every deferred call and give the thread its CPUs back.

        Parent and worker never run at once (each waits for the other), so one CPU loses
        nothing, and a wakeup on the same CPU skips waking an idle core (~50-100 us on small
        VMs). Without the thread pinned, the kernel wakes the parent on the other core after
        nearly every answer and the worker must be moved after it.
        """
        held = None
        if not self.pinned and getcpu is not None:
            try:
                mask = os.sched_getaffinity(0)
                held = cpus.claim(mask, getcpu())
                if held is not None:
                    os.sched_setaffinity(0, (held.cpu,))
                    os.sched_setaffinity(self.pid, (held.cpu,))
                    self._cpu, self.pinned = held.cpu, True
            except OSError:
                pass
        try:
            yield self
            self.flush()
        finally:
            if held is not None:
                self.pinned, self._cpu = False, -1
                held.release()
                try:
                    os.sched_setaffinity(0, mask)
                except OSError:
                    pass

    # ----------------------------------------------------------------- lifecycle
    @property
    def wire(self) -> dict[str, Any]:
        """The observation fields this worker is sent (wire.select_fields)."""
        return self.enc.wire

    @property
    def keeper_pid(self) -> int:
        """The process this one started; its process group holds the keeper, init and worker."""
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self.proc.poll() is None

    @staticmethod
    def _stop(proc: subprocess.Popen, pids: list[int]) -> None:
        """Kill the worker; its keeper reaps it, ends the namespace's init, reaps that and
        exits, so no zombie waits on the host's init. The group kill is the backstop."""
        if proc.returncode is not None:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if pids:
            try:
                proc.wait(timeout=2.0)
                return
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # keeper, init and worker (it cannot leave the group)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _reap(proc: subprocess.Popen, cwd: str, pids: list[int]) -> None:
        WorkerProcess._stop(proc, pids)
        if proc.returncode is None:
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        shutil.rmtree(cwd, ignore_errors=True)

    def kill(self) -> None:
        """Kill the worker (and with it its keeper and the namespace's init)."""
        self._stop(self.proc, self._pids)

    def close(self) -> None:
        if self.dead is None:
            self.dead = "closed"
        self._finalizer()

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the worker so far (while it lives)."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None


@atexit.register
def _kill_all() -> None:
    for w in list(_LIVE):
        w.close()
