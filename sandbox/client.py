"""Parent side of the sandbox: spawn the worker, enforce deadlines, proxy hook calls.

`load_sandboxed_policy(source, axis)` returns an instance of the axis's base class, so the
simulator calls it like any in-process policy; hook calls travel as marshal frames to a
persistent worker process (one frame per round trip, carrying any posted or deferred calls
too) and answers come back as lines of JSON, validated with the same parse_* functions the
simulator uses. Every failure -- a rule broken, a deadline
or budget overrun, an exception in the candidate, a malformed answer -- raises
`SandboxViolation` with a one-line reason and kills the worker's process group.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import json
import marshal
import math
import operator
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from importlib import resources
from typing import Any

from pydantic import ValidationError

from simcore.config import EngineArgs
from simcore.policies.base import (PRIORITY_MAX, PRIORITY_MIN, PolicyError, RetentionDecision, RetentionPolicy,
                                   RoutingPolicy, SchedulingPolicy, parse_instance, parse_priority,
                                   parse_retention)

from . import cpus, layout
from . import worker as _w
from .errors import SandboxViolation
from .gate import check_source

DEFAULT_DECISION_TIMEOUT_S = 1.0
DEFAULT_CPU_BUDGET_S = 60.0
DEFAULT_MEMORY_MB = 1024
LOAD_TIMEOUT_S = 15.0
MAX_PIPELINED = 256   # queued calls with a known answer before they are sent anyway
MAX_REPLY_BYTES = _w.MAX_REPLY_BYTES + 64

_mdumps = marshal.dumps
_loads = json.loads
_LIVE: "weakref.WeakSet[WorkerProcess]" = weakref.WeakSet()


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


_getcpu = _getcpu_fn()
_WORKER_SOURCE: str | None = None

# Answers the worker writes most often, decoded without the JSON parser (see _recv).
_SIMPLE_ANSWERS = {b"release": "release", b"evict": "evict", b"offload": "offload", b"none": "none"}
# [1,int] | [1,"release"...] | [1,["protect",JSON number]]: one regex call (see _parse)
_FAST_ANSWER = re.compile(rb'\[1,(?:(-?[0-9]+)|"(release|evict|offload|none)"|'
                          rb'\["protect",(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\])\]').fullmatch

_PLAIN = frozenset({type(None), bool, int, float, str})
_all_plain = _PLAIN.__contains__


def _plain(obj: Any) -> Any:
    """`obj` with exact builtin types only. marshal would silently write a numpy scalar
    (or any buffer) as bytes, so the simulator's values are normalised before sending."""
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t in (list, tuple) or isinstance(obj, (list, tuple)):
        return (tuple if isinstance(obj, tuple) else list)(_plain(x) for x in obj)
    if isinstance(obj, dict):
        return {_plain(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, str):
        return str(obj)
    if type(obj).__name__ in ("bool_", "bool") or isinstance(obj, bool):
        return bool(obj)
    if hasattr(obj, "__index__"):
        return operator.index(obj)
    if hasattr(obj, "__float__"):
        return float(obj)
    raise SandboxViolation(f"cannot send a {t.__name__} to the policy worker")


def _plain_row(row: Any) -> list:
    """Fast path for flat rows: one C-level pass when every value is already plain."""
    if all(map(_all_plain, map(type, row))):
        return row if type(row) is list else list(row)
    return [_plain(x) for x in row]


def _getter(fields: list[str]) -> Any:
    """obj -> tuple of the named attributes (attrgetter returns a bare value for one name)."""
    if not fields:
        return lambda obj: ()
    g = operator.attrgetter(*fields)
    return g if len(fields) > 1 else (lambda obj: (g(obj),))


def _norm(v: Any) -> Any:
    """JSON brings tuples back as lists."""
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return v


_HEADER = struct.Struct("<I").pack


def _frame(obj: Any) -> bytes:
    """Parent -> worker framing (see sandbox/worker.py): length + marshal of plain data."""
    body = _mdumps(obj)
    return _HEADER(len(body)) + body


_POSTED = {"a": "A"}  # hooks that can be posted (sandbox/worker.py serve), and their letter
_SYNC = ("y", 0.0, ("",), None, None)  # a call answered [1,0] once every call before it ran


def _worker_source() -> str:
    global _WORKER_SOURCE
    if _WORKER_SOURCE is None:
        _WORKER_SOURCE = resources.files("sandbox").joinpath("worker.py").read_text(encoding="utf-8")
    return _WORKER_SOURCE


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a (possibly zombie) process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class ViewEncoder:
    """Observations -> the plain rows sandbox/worker.py rebuilds views from.

    Only the fields in `wire` (worker.select_fields: those the candidate's source can read)
    are sent; history tuples go as (start, new items) against the last send per program.
    """

    def __init__(self, wire: dict[str, Any] | None = None) -> None:
        self.wire = wire = wire or _w.select_fields()
        self._scalars = _getter(wire["view"])
        self._histories = _getter(wire["hist"])
        self._inst = _getter(wire["inst"])
        sig_fields = [f for f in wire["signals"] or () if f != "instances"]
        self._sig_scalars = _getter(sig_fields)
        self._sig_one = operator.attrgetter(sig_fields[0]) if len(sig_fields) == 1 else None
        self._hist: dict[Any, list[tuple]] = {}
        if not wire["hist"]:
            self.view = self._flat_view  # type: ignore[method-assign]

    def _flat_view(self, pcb: Any) -> Any:
        """view() without history fields: the attribute tuple itself when all values are plain."""
        row = self._scalars(pcb)
        return row if all(map(_all_plain, map(type, row))) else [_plain(x) for x in row]

    def view(self, pcb: Any) -> list:
        row = _plain_row(self._scalars(pcb))
        hrow = self._histories(pcb)
        if not hrow:
            return row
        hist = self._hist.get(row[0])
        if hist is None:
            hist = self._hist[row[0]] = [()] * len(hrow)
        for j, v in enumerate(hrow):
            if type(v) is not tuple:
                v = tuple(v)
            old = hist[j]
            n = len(old)
            if len(v) >= n and v[:n] == old:
                row.append(n)
                row.append(_plain_row(v[n:]))
            else:
                row.append(0)
                row.append(_plain_row(v))
            hist[j] = v
        return row

    def signals(self, signals: Any, now: float) -> Any:
        """The wired Signals fields, in SIGNAL_FIELDS order (None: no signals bound)."""
        fields = self.wire["signals"] or ()
        if signals is None:
            return [[] if f == "instances" else _plain(now) if f == "now" else None for f in fields]
        one = self._sig_one
        row = (one(signals),) if one is not None else self._sig_scalars(signals)  # one field: no lambda frame
        if not all(map(_all_plain, map(type, row))):
            row = [_plain(x) for x in row]
        if fields and fields[-1] == "instances":  # last in SIGNAL_FIELDS
            row = [*row, [self.instance(v) for v in signals.instances]]
        return row

    def instance(self, inst: Any) -> list:
        return _plain_row(self._inst(inst))


class WorkerProcess:
    """One isolated worker holding one candidate; line-delimited JSON over two pipes."""

    def __init__(self, source: str, axis: str, *, decision_timeout_s: float = DEFAULT_DECISION_TIMEOUT_S,
                 cpu_budget_s: float = DEFAULT_CPU_BUDGET_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 load_timeout_s: float = LOAD_TIMEOUT_S, seccomp: bool = True, audit: bool = True,
                 wire: dict[str, Any] | None = None, mirror_layout: bool = True) -> None:
        if not (decision_timeout_s > 0 and math.isfinite(decision_timeout_s)):
            raise ValueError(f"decision_timeout_s must be a positive number, got {decision_timeout_s}")
        if not (cpu_budget_s > 0 and math.isfinite(cpu_budget_s)):
            raise ValueError(f"cpu_budget_s must be a positive number, got {cpu_budget_s}")
        self.axis = axis
        self.decision_timeout_s = float(decision_timeout_s)
        self.cpu_budget_s = float(cpu_budget_s)
        self.dead: str | None = None
        self.calls = 0   # hook calls sent
        self.frames = 0  # round trips (a frame carries one or more calls)
        self._buf = bytearray()
        self._last_sig: Any = None
        self._cpu = -1
        self.pinned = False  # True inside session(): parent thread and worker share one CPU
        self.enc = ViewEncoder(wire)
        wire = self.enc.wire
        self._wired_signals = wire["signals"] is not None  # the candidate reads self.signals
        self._outbox: list[tuple] = []  # posted and queued calls not sent yet
        self._queued = 0               # of which queued: their answers are wanted (collect())
        self._ready: list = []         # answers of queued calls sent already
        self._cwd = tempfile.mkdtemp(prefix="agentservesim-sandbox-")
        os.chmod(self._cwd, 0o555)  # empty and read-only: nothing to read, nowhere to write
        cfg = {"ppid": os.getpid(), "cpu_s": max(1, math.ceil(cpu_budget_s)),
               "decision_s": self.decision_timeout_s,
               "mem_bytes": int(memory_mb) << 20, "seccomp": seccomp, "audit": audit,
               "stack_soft": layout.stack_soft_limit()}
        # `-E -s -P` (what -I means) except -E: the environment is ours and empty but for a
        # fixed hash seed, so set/dict order of strings -- and so the decisions -- are the same
        # in every worker (the leakage check and the search compare runs). -S: no site dir.
        # The worker's interpreter library at this process's address (sandbox/layout.py).
        self.proc, plan = layout.spawn(
            [sys.executable, "-s", "-S", "-P", "-B", "-c", _worker_source(), json.dumps(cfg)], mirror_layout,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self._cwd, start_new_session=True, close_fds=True, env={"PYTHONHASHSEED": "0"})
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        self._poll_in = select.poll()
        self._poll_in.register(self._in, select.POLLIN)
        self._poll_out = select.poll()
        self._poll_out.register(self._out, select.POLLOUT)
        _LIVE.add(self)
        self._finalizer = weakref.finalize(self, WorkerProcess._reap, self.proc, self._cwd)
        self._send(_frame({"source": source, "axis": axis, "wire": wire}), time.monotonic() + load_timeout_s,
                   load_timeout_s, "loading the policy")
        info = self._recv(time.monotonic() + load_timeout_s, load_timeout_s, "loading the policy")
        if not isinstance(info, dict):
            self._fail("worker sent a malformed load reply")
        self.info: dict[str, Any] = info
        self.layers: dict[str, str] = dict(info.get("layers", {}))
        self.layout = layout.landed(self.proc.pid, plan)  # "mirrored" or "off: why" (a speed matter)

    # ----------------------------------------------------------------- transport
    def _fail(self, reason: str) -> None:
        self.kill()
        if self.dead is None:
            self.dead = reason
        raise SandboxViolation(reason)

    def _exit_reason(self, what: str) -> str:
        cpu = _cpu_seconds(self.proc.pid)
        try:
            rc = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        if rc in (-signal.SIGXCPU, -signal.SIGKILL) and cpu is not None and cpu >= math.ceil(self.cpu_budget_s) - 0.05:
            return f"exceeded its CPU budget of {self.cpu_budget_s:g} s while {what}"
        if rc == -signal.SIGXCPU:
            return f"exceeded its CPU budget of {self.cpu_budget_s:g} s while {what}"
        if rc == -signal.SIGALRM:  # the worker's own per-call deadline in a frame of many calls
            return f"decision deadline of {self.decision_timeout_s:g} s exceeded while {what}"
        if rc == -signal.SIGSYS:
            return f"made a forbidden system call while {what}"
        if rc is not None and rc < 0:
            return f"worker was killed by signal {signal.Signals(-rc).name} while {what}"
        return f"worker exited unexpectedly (code {rc}) while {what}"

    def _roundtrip(self, call: tuple | None, what: str) -> Any:
        """Send the outbox, then `call`, as one frame and return `call`'s answer.

        Answers of queued calls in the frame go to `self._ready`; posted calls write nothing
        unless they fail, and a failure line comes first (the worker stops there). With
        `call` None, a frame ending in a posted call gets a sync call, so that every failure
        is read now.
        """
        if self.dead is not None:
            raise SandboxViolation(f"policy worker is stopped: {self.dead}")
        calls, queued = self._outbox, self._queued
        if call is None:
            if not calls:
                return None
            what = _w._HOOK_NAMES[calls[-1][0]]
            if calls[-1][0].isupper():
                call = _SYNC
        if calls:  # posted and queued calls travel with this one: one frame, one wakeup
            if call is not None:
                calls.append(call)
            self._outbox, self._queued = [], 0
            what = f"{what} (one of {len(calls)} calls sent together)"
        else:
            calls = (call,)
        answers = self._exchange(calls, queued + (call is not None), what)
        if queued:
            self._ready.extend(answers[:queued])
        return answers[-1] if call is not None else None

    def _exchange(self, calls: Any, n: int, what: str) -> list:
        """Send `calls` as one frame and read `n` answers (posted calls write none).

        The usual case runs inline -- one write takes the frame, and the worker, which ran
        during it on this CPU, has left exactly the answers -- because every Python call
        here costs several times its warm price (the worker has just had the CPU). Anything
        else goes through _send/_recv with the deadline (per call in the frame).
        """
        self.frames += 1
        body = _mdumps(calls)
        msg = _HEADER(len(body)) + body
        timeout_s = self.decision_timeout_s
        try:
            sent = os.write(self._out, msg)
        except (BlockingIOError, BrokenPipeError):
            sent = 0
        if sent == len(msg) and not self._buf:
            try:
                data = os.read(self._in, 1 << 16)
            except BlockingIOError:
                data = None
            if data:
                if data[-1] == 10 and data.count(b"\n") == n:
                    if n == 1:
                        m = _FAST_ANSWER(data, 0, len(data) - 1)
                        if m is not None and m.lastindex != 1:  # the commonest: retention answers
                            return [_SIMPLE_ANSWERS[m.group(2)] if m.lastindex == 2
                                    else ["protect", float(m.group(3))]]
                        return [self._parse(data[:-1], what)]
                    return [self._parse(x, what) for x in data[:-1].split(b"\n")]
                self._buf += data
            elif data is not None:  # end of file: the worker is gone
                self._fail(self._exit_reason(what))
        deadline = time.monotonic() + timeout_s * len(calls)
        if sent != len(msg):
            self._send(msg[sent:], deadline, timeout_s, what)
        return [self._recv(deadline, timeout_s, what) for _ in range(n)]

    def flush(self) -> None:
        """Run every queued and posted call now; raises on the first failure."""
        if self._outbox and self.dead is None:
            self._roundtrip(None, "")

    def post(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any, expected: Any) -> None:
        """Queue a call whose answer is known (`expected`, see sandbox.gate.hook_answers)
        without waiting for it: it travels with the next waited-for call (or flush()), and
        the worker writes back only a failure, or an answer other than `expected`."""
        if self.dead is not None:
            raise SandboxViolation(f"policy worker is stopped: {self.dead}")
        outbox = self._outbox
        outbox.append(self._message(_POSTED[hook], now, pcb, expected if type(expected) is str else _plain(expected),
                                    signals))
        if len(outbox) >= MAX_PIPELINED:
            self.flush()

    def queue(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any) -> None:
        """Queue a call whose answer is wanted later: collect() returns the answers in order."""
        if self.dead is not None:
            raise SandboxViolation(f"policy worker is stopped: {self.dead}")
        self._outbox.append(self._message(hook, now, pcb, extra, signals))
        self._queued += 1
        if len(self._outbox) >= MAX_PIPELINED:
            self.flush()  # bounded frames; the answers wait in self._ready

    def collect(self) -> list:
        """The raw answers of every queued call so far, in order (one round trip at most)."""
        self.flush()
        out, self._ready = self._ready, []
        return out

    def _send(self, msg: bytes, deadline: float, timeout_s: float, what: str) -> None:
        view = memoryview(msg)
        while view:
            try:
                n = os.write(self._out, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except BrokenPipeError:
                self._fail(self._exit_reason(what))
            left = deadline - time.monotonic()
            if left <= 0 or not self._poll_out.poll(left * 1000.0):
                self._fail(f"decision deadline of {timeout_s:g} s exceeded while {what}")

    def _recv(self, deadline: float, timeout_s: float, what: str) -> Any:
        buf = self._buf
        line = None
        if not buf:  # the usual case: the worker ran during our write and left one line
            try:
                chunk = os.read(self._in, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk is not None:
                if not chunk:
                    self._fail(self._exit_reason(what))
                if chunk.find(b"\n") == len(chunk) - 1:
                    line = chunk[:-1]
                else:
                    buf += chunk
        while line is None:
            i = buf.find(b"\n")
            if i >= 0:
                line = bytes(buf[:i])
                del buf[:i + 1]
                break
            if len(buf) > MAX_REPLY_BYTES:
                self._fail(f"answer larger than {MAX_REPLY_BYTES} bytes while {what}")
            try:  # read first: the worker usually ran during our write, so no poll() syscall
                chunk = os.read(self._in, 1 << 16)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0 or not self._poll_in.poll(left * 1000.0):
                    self._fail(f"decision deadline of {timeout_s:g} s exceeded while {what}")
                continue
            if not chunk:
                self._fail(self._exit_reason(what))
            buf += chunk
        return self._parse(line, what)

    def _parse(self, line: bytes, what: str) -> Any:
        """One answer line -> the value; a failure line or a malformed one fails the worker."""
        m = _FAST_ANSWER(line)  # the common answers, without the JSON parser
        if m is not None:
            i = m.lastindex
            if i == 1:
                try:
                    return int(m.group(1))
                except ValueError:  # more digits than int() accepts
                    self._fail(f"worker sent a malformed answer while {what}")
            if i == 2:
                return _SIMPLE_ANSWERS[m.group(2)]
            return ["protect", float(m.group(3))]
        try:
            ok, value = _loads(line)
        except (ValueError, TypeError):
            self._fail(f"worker sent a malformed answer while {what}")
        if ok != 1:
            self._fail(str(value) if isinstance(value, str) else f"policy failed while {what}")
        return value

    def call(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any) -> Any:
        """One hook call; returns the raw JSON-decoded value (validated by the caller)."""
        return self._roundtrip(self._message(hook, now, pcb, extra, signals), _w._HOOK_NAMES[hook])

    def _message(self, hook: str, now: float, pcb: Any, extra: Any, signals: Any) -> tuple:
        """One call as plain data: (hook, now, view row, extra, signals row or None if unchanged)."""
        sig = None
        if signals is not self._last_sig and self._wired_signals:  # else: unchanged, or never read
            sig = self.enc.signals(signals, now)
            self._last_sig = signals
        self.calls += 1
        if not self.pinned and _getcpu is not None:
            # Keep the worker on the CPU the parent runs on: the two never run at the same
            # time (each waits for the other), and a same-CPU wakeup avoids waking an idle
            # core, which costs ~100 us per call on small VMs.
            cpu = _getcpu()
            if cpu != self._cpu:
                self._cpu = cpu
                try:
                    os.sched_setaffinity(self.proc.pid, (cpu,))
                except OSError:
                    pass
        return (hook, now if type(now) is float else _plain(now), self.enc.view(pcb), extra, sig)

    @contextlib.contextmanager
    def session(self) -> Any:
        """One simulation: pin the calling thread and the worker to one free CPU (sandbox.cpus),
        and on the way out run every posted or queued call and give the thread its CPUs back.

        Parent and worker never run at once (each waits for the other), so one CPU loses
        nothing, and a wakeup on the same CPU skips waking an idle core (~50-100 us on small
        VMs). Without the thread pinned, the kernel wakes the parent on the other core after
        nearly every answer and the worker must be moved after it.
        """
        held = None
        if not self.pinned and _getcpu is not None:
            try:
                mask = os.sched_getaffinity(0)
                held = cpus.claim(mask, _getcpu())
                if held is not None:
                    os.sched_setaffinity(0, (held.cpu,))
                    os.sched_setaffinity(self.proc.pid, (held.cpu,))
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
    @staticmethod
    def _reap(proc: subprocess.Popen, cwd: str) -> None:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
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
        """Kill the worker's whole process group (it has its own session)."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        if self.dead is None:
            self.dead = "closed"
        self._finalizer()

    def cpu_seconds(self) -> float | None:
        return _cpu_seconds(self.proc.pid)


@atexit.register
def _kill_all() -> None:
    for w in list(_LIVE):
        w.close()


# --------------------------------------------------------------------- proxies
_NO = object()


class _Proxy:
    """Mixin: holds the worker; `signals` is set by the simulator through bind().

    `_const` holds the answers of hooks the gate proved constant (sandbox.gate.constant_hooks):
    those are answered here, without a round trip, and validated exactly like worker answers.
    """
    _worker: WorkerProcess
    _const: dict[str, Any] = {}
    _post: dict[str, Any] = {}

    def close(self) -> None:
        self._worker.close()

    def simulation_run(self) -> Any:
        """Entered by simulate() around a run (see WorkerProcess.session)."""
        return self._worker.session()

    def flush(self) -> None:
        """Run every posted or deferred call now; raises SandboxViolation on a failure."""
        self._worker.flush()

    @property
    def sandbox_layers(self) -> dict[str, str]:
        return self._worker.layers

    @property
    def sandbox_layout(self) -> str:
        """"mirrored" (the worker maps the interpreter at this process's address) or "off: why"."""
        return self._worker.layout

    def _sig(self) -> Any:
        return getattr(self, "signals", None)


class SandboxedRetention(_Proxy, RetentionPolicy):
    _posted_decision: tuple = (_NO, None)

    def on_turn_complete(self, pcb: Any, request_id: str, now: float) -> Any:
        raw = self._const.get("on_turn_complete", _NO)
        if raw is _NO:
            raw = self._worker.call("c", now, pcb, str(request_id), self.__dict__.get("signals"))
            # the common answers, as parse_retention would take them (a finite float deadline)
            if type(raw) is list and len(raw) == 2 and raw[0] == "protect" and type(raw[1]) is float \
                    and raw[1] - raw[1] == 0.0:
                return RetentionDecision("protect", raw[1])
            d = _SIMPLE_DECISIONS.get(raw) if type(raw) is str else None
            if d is not None:
                return d
        return _retention(raw, self._worker, "on_turn_complete")

    def on_turn_arrival(self, pcb: Any, now: float) -> Any:
        raw = self._const.get("on_turn_arrival", _NO)
        if raw is _NO:
            raw = self._post.get("on_turn_arrival", _NO)
            if raw is not _NO:
                self._worker.post("a", now, pcb, None, self.__dict__.get("signals"), raw)
                known = self._posted_decision
                if raw is known[0]:
                    return known[1]
            else:
                raw = self._worker.call("a", now, pcb, None, self._sig())
        return _retention(raw, self._worker, "on_turn_arrival")


_SIMPLE_DECISIONS = {k: parse_retention(k) for k in ("release", "evict", "offload", "none")}


class SandboxedScheduling(_Proxy, SchedulingPolicy):
    # Deferred priorities (simcore/policies/base.py): the engine asks for an order only when
    # it needs one, and every priority queued by then comes back in one round trip.
    defers_priority = False  # set by load_sandboxed_policy

    def priority(self, pcb: Any, now: float) -> int:
        raw = self._const.get("priority", _NO)
        if raw is _NO:
            raw = self._worker.call("p", now, pcb, None, self.__dict__.get("signals"))
        return self._priority(raw)

    def defer_priority(self, pcb: Any, now: float) -> None:
        self._worker.queue("p", now, pcb, None, self.__dict__.get("signals"))

    def collect_priorities(self) -> list[int]:
        return [self._priority(raw) for raw in self._worker.collect()]

    def _priority(self, raw: Any) -> int:
        if type(raw) is int and PRIORITY_MIN <= raw <= PRIORITY_MAX:
            return raw  # what parse_priority would return, without the call
        try:
            return parse_priority(raw)
        except Exception as e:  # noqa: BLE001 - PolicyError and anything odd in the value
            self._worker._fail(f"priority: {e}")


class SandboxedRouting(_Proxy, RoutingPolicy):
    def select(self, pcb: Any, inflight: tuple, now: float) -> int:
        raw = self._const.get("select", _NO)
        if raw is _NO:
            w = self._worker
            raw = w.call("s", now, pcb, [w.enc.instance(v) for v in inflight], self._sig())
        try:
            return parse_instance(raw, len(inflight))
        except Exception as e:  # noqa: BLE001
            self._worker._fail(f"select: {e}")


def _retention(raw: Any, worker: WorkerProcess, hook: str) -> Any:
    try:
        return parse_retention(tuple(raw) if isinstance(raw, list) else raw)
    except Exception as e:  # noqa: BLE001
        worker._fail(f"{hook}: {e}")


_PROXIES = {"retention": SandboxedRetention, "scheduling": SandboxedScheduling, "routing": SandboxedRouting}


def _engine_args(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SandboxViolation("engine_args must be a dict")
    try:
        EngineArgs(**raw)
    except (ValidationError, TypeError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": str(e)}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise SandboxViolation(f"engine_args{('.' + loc) if loc else ''}: {first.get('msg')}") from None
    return dict(raw)


def load_sandboxed_policy(source: str, axis: str, *, decision_timeout_s: float = DEFAULT_DECISION_TIMEOUT_S,
                          cpu_budget_s: float = DEFAULT_CPU_BUDGET_S, memory_mb: int = DEFAULT_MEMORY_MB,
                          load_timeout_s: float = LOAD_TIMEOUT_S, gate: bool = True, seccomp: bool = True,
                          audit: bool = True, constant_hooks: bool = True, defer: bool = True,
                          mirror_layout: bool = True) -> Any:
    """A policy object of `axis`'s base class whose hooks run in an isolated worker.

    The static gate runs first (gate=False exists only so that tests can show the worker
    contains what the gate would have refused). Hooks the gate proves constant are answered
    without a round trip (constant_hooks=False turns that off, for tests). A scheduling
    policy defers its priorities to when the engine needs an order (defer=False: one round
    trip per call, for comparison). The worker maps the interpreter where this process does,
    so the two share branch predictions (sandbox/layout.py; mirror_layout=False gives it
    its own randomised layout). Close it with `.close()`; it is also killed when
    garbage-collected, at interpreter exit, and when this process dies.
    """
    const: dict[str, Any] = {}
    always: dict[str, Any] = {}
    wire = None  # without the gate nothing bounds what the code reads: send every field
    if gate:
        g = check_source(source, axis)
        const, always = g.constant_hooks, g.always_hooks
        wire = _w.select_fields(g.observed_names)
    w = WorkerProcess(source, axis, decision_timeout_s=decision_timeout_s, cpu_budget_s=cpu_budget_s,
                      memory_mb=memory_mb, load_timeout_s=load_timeout_s, seccomp=seccomp, audit=audit,
                      wire=wire, mirror_layout=mirror_layout)
    try:
        ea = _engine_args(w.info.get("engine_args", {}))
    except SandboxViolation:
        w.close()
        raise
    name = str(w.info.get("name") or w.info.get("class") or "candidate")
    proxy_cls = type(f"Sandboxed_{w.info.get('class', 'Policy')}", (_PROXIES[axis],),
                     {"name": name, "engine_args": ea})
    policy = proxy_cls()
    policy._worker = w
    policy._const = dict(const) if constant_hooks else {}
    # Posting on_turn_arrival is safe only while on_turn_complete still waits for its
    # answer: every arrival of a program is followed by that call's completion, whose frame
    # carries the posted calls, so no failure can go unread at the end of a run.
    if constant_hooks and axis == "retention" and "on_turn_complete" not in const \
            and "on_turn_arrival" in always and "on_turn_arrival" not in const:
        policy._post = {"on_turn_arrival": always["on_turn_arrival"]}
        try:  # what the posted answer means, parsed once
            raw = policy._post["on_turn_arrival"]
            policy._posted_decision = (raw, parse_retention(tuple(raw) if isinstance(raw, list) else raw))
        except PolicyError:
            pass  # a malformed answer: parsed (and refused) at each call, as for the worker's
    if axis == "scheduling":
        policy.defers_priority = defer and "priority" not in policy._const
    return policy
