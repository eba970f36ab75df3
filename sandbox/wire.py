"""The wire format between the simulator and the worker (the worker's side: worker/serve.py).

Parent -> worker: a 4-byte little-endian length + `marshal` of plain data (the parent is
trusted; marshal is 5x faster than JSON). Worker -> parent: one JSON value per line, parsed
here as untrusted input: bounded in size and depth, and never pickle or marshal.

Only the observation fields a candidate's source can read cross the pipe: the gate refuses
getattr, vars, dunders and `.format`, so a field is read as `x.name` written in the source
(`select_fields`); a source that turns whole views into text or hashes gets every field.
The four growing history tuples of a view travel as deltas.
"""
from __future__ import annotations

import json
import marshal
import operator
import re
import struct
from typing import Any

from simcore.pcb import observation_schema

from .errors import SandboxViolation

MAX_REPLY_BYTES = (1 << 16) + 64  # the worker's own limit (worker/serve.py) plus the framing
MAX_ANSWER_DEPTH = 4              # the deepest valid answer is ["protect", t, v, "offload"]
HOOK_NAMES = {"c": "on_turn_complete", "a": "on_turn_arrival", "p": "priority", "s": "select"}

_mdumps = marshal.dumps
_HEADER = struct.Struct("<I").pack


def frame(obj: Any) -> bytes:
    """Parent -> worker framing: length + marshal of plain data."""
    body = _mdumps(obj)
    return _HEADER(len(body)) + body


# --------------------------------------------------------------------------- fields sent
def select_fields(names: frozenset[str] | None = None) -> dict[str, Any]:
    """The fields to send for a candidate whose source names the attributes `names`.

    None sends everything. program_id is always sent (the history deltas are keyed by it).
    A derived member (ProgramView.gap_elapsed_s, InstanceView.inflight) brings the fields it
    reads. Signals go when the source names `signals` or overrides `bind`.
    """
    schema = observation_schema()

    def want(field: str, cls: str) -> bool:
        return names is None or field in names or any(
            m in names and field in spec["reads"] for m, spec in schema[cls]["members"].items())
    pv = schema["ProgramView"]
    hist = pv["history"]
    view = [f for f in pv["fields"] if f == "program_id" or want(f, "ProgramView")]
    inst = [f for f in schema["InstanceView"]["fields"] if want(f, "InstanceView")]
    signals = None
    if names is None or "signals" in names or "bind" in names:
        signals = [f for f in schema["Signals"]["fields"] if want(f, "Signals")]
    return {"view": [f for f in view if f not in hist], "hist": [f for f in view if f in hist], "inst": inst,
            "signals": signals}


# --------------------------------------------------------------------------- encoding
_PLAIN = frozenset({type(None), bool, int, float, str})
_all_plain = _PLAIN.__contains__


def plain(obj: Any) -> Any:
    """`obj` with exact builtin types only. marshal would silently write a numpy scalar
    (or any buffer) as bytes, so the simulator's values are normalised before sending."""
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t in (list, tuple) or isinstance(obj, (list, tuple)):
        return (tuple if isinstance(obj, tuple) else list)(plain(x) for x in obj)
    if isinstance(obj, dict):
        return {plain(k): plain(v) for k, v in obj.items()}
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
    return [plain(x) for x in row]


def _getter(fields: list[str]) -> Any:
    """obj -> tuple of the named attributes (attrgetter returns a bare value for one name)."""
    if not fields:
        return lambda obj: ()
    g = operator.attrgetter(*fields)
    return g if len(fields) > 1 else (lambda obj: (g(obj),))


class ViewEncoder:
    """Observations -> the plain rows worker/views.py rebuilds views from.

    Only the fields in `wire` (select_fields) are sent; history tuples go as (start, new
    items) against the last send per program.
    """

    def __init__(self, wire: dict[str, Any] | None = None) -> None:
        self.wire = wire = wire or select_fields()
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
        return row if all(map(_all_plain, map(type, row))) else [plain(x) for x in row]

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
        """The wired Signals fields, in schema order (None: no signals bound)."""
        fields = self.wire["signals"] or ()
        if signals is None:
            return [[] if f == "instances" else plain(now) if f == "now" else None for f in fields]
        one = self._sig_one
        row = (one(signals),) if one is not None else self._sig_scalars(signals)  # one field: no lambda frame
        if not all(map(_all_plain, map(type, row))):
            row = [plain(x) for x in row]
        if fields and fields[-1] == "instances":  # last in the schema
            row = [*row, [self.instance(v) for v in signals.instances]]
        return row

    def instance(self, inst: Any) -> list:
        return _plain_row(self._inst(inst))


# --------------------------------------------------------------------------- answers
# Answers the worker writes most often, decoded without the JSON parser.
SIMPLE_ANSWERS = {b"release": "release", b"evict": "evict", b"offload": "offload", b"none": "none"}
# [1,int] | [1,"release"...] | [1,["protect",JSON number]]: one regex call
FAST_ANSWER = re.compile(rb'\[1,(?:(-?[0-9]+)|"(release|evict|offload|none)"|'
                         rb'\["protect",(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\])\]').fullmatch


class Malformed(Exception):
    """An answer line that is not a well-formed, bounded JSON answer."""


def _too_deep(value: Any, depth: int) -> bool:
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d >= depth:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


class Failed(Exception):
    """The worker answered with a failure line; str(e) is its reason (candidate text)."""


def parse_answer(line: bytes) -> Any:
    """One answer line -> the value; raises Failed for a failure line, Malformed otherwise."""
    m = FAST_ANSWER(line)  # the common answers, without the JSON parser
    if m is not None:
        i = m.lastindex
        if i == 1:
            try:
                return int(m.group(1))
            except ValueError:  # more digits than int() accepts
                raise Malformed("an integer too long") from None
        if i == 2:
            return SIMPLE_ANSWERS[m.group(2)]
        return ["protect", float(m.group(3))]
    ok, value = decode(line)
    if ok != 1:
        raise Failed(value if isinstance(value, str) else "the policy failed")
    return value


def decode(line: bytes, max_depth: int = MAX_ANSWER_DEPTH) -> tuple[int, Any]:
    """(ok, value) of one answer line; raises Malformed (never RecursionError, never a
    traceback) for anything but `[0|1, JSON value]` nested at most `max_depth` deep."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError, MemoryError):
        raise Malformed("not JSON") from None
    if type(msg) is not list or len(msg) != 2 or type(msg[0]) is not int or msg[0] not in (0, 1):
        raise Malformed("not an [ok, value] pair")
    if _too_deep(msg[1], max_depth):
        raise Malformed(f"nested deeper than {max_depth}")
    return msg[0], msg[1]
