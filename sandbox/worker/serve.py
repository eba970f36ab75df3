"""The worker's side of the pipe: the candidate's namespace, the tripwire, loading, answers.

Start-up order (main): import everything the candidate may use; harden (harden.isolate:
the kernel boundary, which also forks the process tree); arm the audit tripwire; report
the layers to the parent -- all before the first byte of the candidate arrives, so the
report cannot come from candidate code; then load the candidate and answer frames.

Protocol. Parent -> worker: frames of a 4-byte little-endian length + a `marshal` dump of
plain data (str/int/float/bool/None/list/tuple/dict); the parent is trusted and marshal is
5x faster than json here. Worker -> parent: one JSON value per line, because the parent
must parse what untrusted code produced (never pickle, never marshal, in that direction).
  keeper -> [2, worker pid]        worker -> [3, {layer: "on..." | "off: why"}]
  parent -> {"source", "axis", "wire"}                      worker -> [1, info] | [0, reason]
  parent -> [call, ...], call = [hook, now, pcb_row, extra, signals|None]
                                                            worker -> [1, value] | [0, reason]
One frame per round trip; every call in it is answered, in order, in one write (the parent
stops at the first failure). Hooks: "c" (on_turn_complete, extra = request_id), "a"
(on_turn_arrival), "p" (priority), "s" (select, extra = instance rows); signals None =
unchanged. Rows carry only the fields named by "wire" (wire.select_fields).
"""
from __future__ import annotations

import gc
import json
import marshal
import os
import signal
import sys

from . import harden, views

MAX_REPLY_BYTES = 1 << 16
HOOK_NAMES = {}  # hook letter -> name, for reasons (sandbox/wire.py HOOK_NAMES, sent at start-up)


def _send(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def die(reason):
    """End the worker now with a reason (the candidate cannot catch this)."""
    try:
        _send([0, str(reason)[:2000]])
    finally:
        os._exit(4)


def _reason(exc):
    try:
        msg = str(exc).replace("\n", " ")
    except Exception:  # noqa: BLE001 - a hostile __str__
        msg = "<unprintable message>"
    if len(msg) > 300:
        msg = msg[:300] + "..."
    return type(exc).__name__ + (": " + msg if msg else "")


# --------------------------------------------------------------------------- tripwire
# Audit events that only an escape attempt raises. The hook is a tripwire, not the wall
# (the kernel is): it ends the worker at once with a reason, and cannot be caught.
_PREFIXES = ("open", "os.", "subprocess.", "socket.", "ctypes.", "sys._getframe", "sys._current_frames",
             "sys._current_exceptions", "gc.", "import", "compile", "exec", "pickle.", "shutil.", "urllib.",
             "http.", "_thread.", "code.__new__", "function.__new__", "sys.setprofile", "sys.settrace",
             "builtins.input", "pty.", "resource.", "signal.", "syslog.", "mmap.", "fcntl.", "sqlite3.",
             "webbrowser", "ftplib.", "smtplib.", "telnetlib.", "poplib.", "imaplib.", "nntplib.", "glob.",
             "tempfile.", "socket", "sys.unraisablehook", "sys.excepthook", "cpython.", "array.",
             "sys.addaudithook")
# compile/exec: the candidate itself, dataclass and namedtuple code; _getframe: namedtuple
# and enum read their caller's module name; addaudithook: the second hook itself. Allowed
# while loading only.
_LOAD_OK = ("compile", "exec", "sys._getframe", "sys.addaudithook")
# Attribute reads that lead to frames (and from there to any namespace); audited by CPython.
_FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code", "ag_code")

# The hook keeps no state: its tables are constants in a globals dict of its own that only
# the interpreter's hook list references, so no frame walk or module global reaches it.
# Two hooks: the first allows _LOAD_OK, the second (added after loading) does not.
_HOOK_SOURCE = '''
def hook(event, args):
    if event == "marshal.loads":
        return
    if event == "object.__getattr__":
        if len(args) > 1 and type(args[1]) is str and args[1] in FRAMES:
            stop("object.__getattr__ " + args[1])
        return
    if event in ALLOW:
        return
    if event.startswith(PREFIXES):
        stop(event)


def stop(what):
    text = "".join([c if c in SAFE else "?" for c in what[:80]])
    try:
        write(1, ('[0,"blocked operation: ' + text + '"]\\n').encode())
    finally:
        exit(3)
'''


def arm_tripwire(loading):
    env = {"__builtins__": {"len": len, "type": type, "str": str},
           "ALLOW": frozenset(_LOAD_OK) if loading else frozenset(),
           "FRAMES": frozenset(_FRAME_ATTRS), "PREFIXES": _PREFIXES,
           "SAFE": frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._ "),
           "write": os.write, "exit": os._exit}
    exec(compile(_HOOK_SOURCE, "<tripwire>", "exec", dont_inherit=True), env)  # noqa: S102 - our own code
    sys.addaudithook(env["hook"])


# --------------------------------------------------------------------------- namespace
class _Module:
    """A read-only stand-in for an allow-listed module (its allow-listed names only)."""
    __slots__ = ("_ns",)

    def __init__(self, ns):
        object.__setattr__(self, "_ns", ns)

    def __getattr__(self, name):
        ns = object.__getattribute__(self, "_ns")
        if name in ns:
            return ns[name]
        raise AttributeError("module has no attribute " + repr(name) + " (or it is not allowed in a policy)")

    def __setattr__(self, name, value):
        raise AttributeError("modules are read-only in the sandbox")


def _no_functional_enum(*args, **kwargs):
    raise TypeError("the functional Enum API (Enum('Name', names)) is not available in a policy; "
                    "define an Enum class instead")


def safe_builtins(cfg):
    import builtins
    safe = {n: getattr(builtins, n) for n in cfg["api"]["builtins"] if hasattr(builtins, n)}
    safe["__build_class__"] = builtins.__build_class__
    safe["print"] = lambda *a, **k: None  # stdout is the protocol pipe
    return safe


def import_modules(cfg):
    """Every allow-listed module, imported now (nothing can be imported once hardened)."""
    import importlib
    import unicodedata  # noqa: F401 - the compiler imports it for non-ASCII identifiers
    api = cfg["api"]
    mods = {}
    for m, names in api["modules"].items():
        real = importlib.import_module(m)
        mods[m] = _Module({n: getattr(real, n) for n in names if hasattr(real, n)})
    enum = importlib.import_module("enum")
    # Enum("E", names) builds a class from run-time names; class statements do not use this
    enum.EnumType._create_ = classmethod(_no_functional_enum)
    typing = importlib.import_module("typing")
    mods["typing"] = _Module({n: getattr(typing, n) for n in api["typing"]})
    future = importlib.import_module("__future__")
    mods["__future__"] = _Module({"annotations": future.annotations})
    return mods


def policy_bases(cfg, safe):
    """simcore.policies.base's classes, compiled from the source the parent sent."""
    import __future__
    import typing
    env = {"__builtins__": safe, "__name__": cfg["bases"]["module"], "Any": typing.Any,
           "ClassVar": typing.ClassVar}
    code = compile(cfg["bases"]["source"], "<%s>" % cfg["bases"]["module"], "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, env)  # noqa: S102 - the simulator's own source
    return {n: env[n] for n in cfg["bases"]["names"]}


def candidate_namespace(cfg, safe, mods, bases, classes):
    api = cfg["api"]
    names = dict(bases)
    names.update(classes)
    policy_mod = _Module({n: names[n] for n in api["policy_names"] if n in names})
    table = dict(mods)
    for m in api["policy_modules"]:
        table[m] = policy_mod

    def restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in table:
            raise ImportError("import of '%s' is not allowed in a policy" % name)
        if (name in ("typing", "__future__") or name in api["policy_modules"]) and not fromlist:
            raise ImportError("use 'from %s import ...' for '%s'" % (name, name))
        return table[name]

    builtins_ = dict(safe)
    builtins_["__import__"] = restricted_import
    ns = {"__builtins__": builtins_, "__name__": cfg["module_name"]}
    for n in cfg["globals"]:  # what simcore.policies.registry.policy_namespace() gives in-process
        ns[n] = mods[n] if n in mods else names[n]
    return ns


def load_candidate(source, axis, ns, bases, cfg):
    """Exec the candidate and instantiate its policy class for `axis`, chosen as in-process
    (simcore.policies.registry.policy_class_from_source: the last one the file defines)."""
    base = bases[cfg["axis_bases"][axis]]
    code = compile(source, cfg["filename"], "exec", dont_inherit=True)
    exec(code, ns)  # noqa: S102 - restricted namespace, isolated process
    found = [v for v in list(ns.values()) if isinstance(v, type) and issubclass(v, base) and v is not base]
    if not found:
        raise ValueError("defines no subclass of %s (axis '%s')" % (base.__name__, axis))
    own = [c for c in found if c.__module__ == cfg["module_name"]] or found
    cls = own[-1]
    policy = cls()
    ea = getattr(policy, "engine_args", {})
    if not isinstance(ea, dict):
        raise ValueError("engine_args must be a dict")
    name = getattr(policy, "name", "")
    return policy, {"class": str(cls.__name__), "name": str(name) if name else "", "engine_args": ea}


# --------------------------------------------------------------------------- serving
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


_SIMPLE_ANSWERS = {v: '[1,"%s"]\n' % v for v in ("release", "evict", "offload", "none")}


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


def serve(policy, frames, decision_s, default_bind):
    """Answer frames of calls until the parent closes the pipe; one write per frame."""
    encode = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode
    signals = views.empty_signals()
    # Locals for the hot loop: each global or call costs several times its warm price here,
    # because the parent has just run on this CPU (see docs/sandbox.md#overhead).
    new = tuple.__new__
    setattr_ = object.__setattr__
    plain_bind = type(policy).bind is default_bind
    view_cls, sig_cls, flat = views.ProgramView, views.Signals, not views.N_HIST
    make_view, make_signals, make_instances = views.make_view, views.make_signals, views.make_instances
    flat_sig = not (views.WIRE["signals"] and views.WIRE["signals"][-1] == "instances")
    write = os.write
    # A frame of many calls (deferred priorities) has one deadline in the parent,
    # decision_s per call; here each call also gets its own, in CPU time (ITIMER_PROF, as
    # the parent's), so a stuck call ends the worker (SIGPROF's default action) within
    # decision_s of computing, as a lone call would, and a starved one does not.
    alarm, real = signal.setitimer, signal.ITIMER_PROF
    while True:
        calls = frames.next()
        if calls is None:
            return
        answers = []
        timed = decision_s > 0 and len(calls) > 2
        for hook, now, row, extra, sig in calls:
            if timed:
                alarm(real, decision_s)
            if sig is not None:
                signals = new(sig_cls, sig) if flat_sig else make_signals(sig)
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
                elif hook == "a":
                    out = _answer(policy.on_turn_arrival(view, now), encode)
                else:
                    out = _answer(policy.select(view, make_instances(extra), now), encode)
            except BaseException as e:  # noqa: BLE001 - every failure becomes a one-line reason
                out = json.dumps([0, "%s raised %s" % (HOOK_NAMES.get(hook, "hook"), _reason(e))]) + "\n"
            if len(out) > MAX_REPLY_BYTES:
                out = json.dumps([0, "%s returned a value larger than %d bytes"
                                  % (HOOK_NAMES.get(hook, "hook"), MAX_REPLY_BYTES)]) + "\n"
            answers.append(out)
            if out[1] == "0":
                break  # the parent stops at the first failure
        if timed:
            alarm(real, 0)
        data = (answers[0] if len(answers) == 1 else "".join(answers)).encode()
        while data:
            data = data[write(1, data):]


def main(cfg_json):
    cfg = json.loads(cfg_json)
    HOOK_NAMES.update(cfg["hooks"])
    safe = safe_builtins(cfg)
    views.prepare(cfg["schema"], safe, die)
    bases = policy_bases(cfg, safe)
    mods = import_modules(cfg)
    layers = harden.isolate(cfg)  # the keeper and init processes never return from here
    audit = "audit" not in (cfg.get("disable") or ())
    if audit:
        arm_tripwire(loading=True)
        layers.mark("audit_tripwire", True)
    else:
        layers.mark("audit_tripwire", False, "disabled by the caller")
    _send([3, dict(layers)])
    frames = FrameReader()
    msg = frames.next()
    if not isinstance(msg, dict):
        os._exit(0)
    try:
        classes = views.configure(msg["wire"])
        if cfg.get("native"):  # tests only: a native payload past the gate (docs/sandbox.md)
            safe["ctypes"] = sys.modules["ctypes"]  # loaded by harden.Host; no import now
        ns = candidate_namespace(cfg, safe, mods, bases, classes)
        policy, info = load_candidate(msg["source"], msg["axis"], ns, bases, cfg)
        text = json.dumps(info, separators=(",", ":"))
    except BaseException as e:  # noqa: BLE001 - a load failure is a reason, whatever it is
        _send([0, "loading failed: " + _reason(e)])
        os._exit(0)
    if audit:
        arm_tripwire(loading=False)
    # Everything alive now (modules, the candidate's code) lives as long as the worker: keep
    # the cyclic collector from walking it again and again (each walk evicts the parent's
    # caches on the shared CPU); the candidate's own garbage is still collected.
    gc.collect()
    gc.freeze()
    data = ("[1," + text + "]\n").encode()
    while data:
        data = data[os.write(1, data):]
    serve(policy, frames, float(cfg.get("decision_s", 0)), bases[cfg["bases"]["root"]].bind)
    os._exit(0)
