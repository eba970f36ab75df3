"""Observation views rebuilt in the worker from plain rows, generated from simcore.pcb's schema.

The parent sends the schema (field order, the growing history fields, the derived members'
source) at start-up (simcore.pcb.observation_schema); nothing here is a hand copy of it.

A view behaves like simcore's frozen dataclass for everything a policy can do with it:
attribute reads, the derived members, ==, hash(), repr(), no ordering, no indexing, no
iteration, no assignment (FrozenInstanceError), dataclasses.fields/asdict/replace. Only the
fields the candidate's source names are sent (sandbox/wire.py select_fields); reading any
other one (by a name built at run time), or using a whole view where the unsent fields
matter (==, hash, repr of a partial view), ends the worker with a reason instead of
silently answering something the in-process policy would not. The fitness stays a property
of the file: the same decisions, or a refusal.
"""
from __future__ import annotations

import __future__
import dataclasses
from _collections import _tuplegetter

ProgramView = InstanceView = Signals = None
WIRE: dict = {}
N_SCALAR = N_HIST = 0
_SCHEMA: dict = {}
_MEMBERS: dict = {}     # class name -> {member: (object, fields it reads)}
_die = None             # serve.die: write a failure line and exit
_HISTORY: dict = {}


class _View(tuple):
    """Base of the rebuilt views: values in a tuple, read through C field descriptors."""
    __slots__ = ()

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __getitem__(self, i):
        raise TypeError("'%s' object is not subscriptable" % type(self).__name__)

    def __iter__(self):
        raise TypeError("'%s' object is not iterable" % type(self).__name__)

    def __len__(self):
        raise TypeError("object of type '%s' has no len()" % type(self).__name__)

    def __contains__(self, item):
        raise TypeError("argument of type '%s' is not iterable" % type(self).__name__)

    def __bool__(self):
        return True

    # The operations a tuple has and a dataclass lacks raise as they would in-process; they
    # raise rather than return NotImplemented, since the reflected tuple operation would
    # otherwise compare or add the view as a tuple.
    def __lt__(self, other):
        raise TypeError("'<' not supported between instances of '%s' and '%s'"
                        % (type(self).__name__, type(other).__name__))

    def __le__(self, other):
        raise TypeError("'<=' not supported between instances of '%s' and '%s'"
                        % (type(self).__name__, type(other).__name__))

    def __gt__(self, other):
        raise TypeError("'>' not supported between instances of '%s' and '%s'"
                        % (type(self).__name__, type(other).__name__))

    def __ge__(self, other):
        raise TypeError("'>=' not supported between instances of '%s' and '%s'"
                        % (type(self).__name__, type(other).__name__))

    def __add__(self, other):
        raise TypeError("unsupported operand type(s) for +: '%s' and '%s'"
                        % (type(self).__name__, type(other).__name__))

    def __radd__(self, other):
        raise TypeError("unsupported operand type(s) for +: '%s' and '%s'"
                        % (type(other).__name__, type(self).__name__))

    def __mul__(self, other):
        raise TypeError("unsupported operand type(s) for *: '%s' and '%s'"
                        % (type(self).__name__, type(other).__name__))

    def __rmul__(self, other):
        raise TypeError("unsupported operand type(s) for *: '%s' and '%s'"
                        % (type(other).__name__, type(self).__name__))

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return False  # a dataclass's NotImplemented ends in identity; a tuple's would compare
        self.__view_whole__("compares")
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        self.__view_whole__("hashes")
        order = type(self).__view_order__
        return tuple.__hash__(self) if order is None else hash(tuple(tuple.__getitem__(self, i) for i in order))

    def __repr__(self):
        self.__view_whole__("prints")
        cls = type(self)
        return "%s(%s)" % (cls.__qualname__, ", ".join("%s=%r" % (f, getattr(self, f)) for f in cls.__match_args__))

    def __reduce__(self):
        self.__view_whole__("copies")
        return (type(self), tuple(getattr(self, f) for f in type(self).__match_args__))

    def __view_whole__(self, what):
        cls = type(self)
        if cls.__view_partial__:
            _die("%s a whole %s, but only the fields its source names were sent (%s); use repr(), str() "
                 "or hash() by name, or read fields as attributes" % (what, cls.__name__, ", ".join(cls.__view_sent__)))


def _unsent(cname, field):
    def read(self):
        _die("read the observation field %s.%s by a name built at run time; write it as an attribute "
             "(x.%s) so that it is sent" % (cname, field, field))
    return property(read)


def _not_a_member(cname, name):
    def read(self):
        raise AttributeError("'%s' object has no attribute '%s'" % (cname, name))
    return property(read)


def _dataclass_fields(order, types):
    out = {}
    for f in order:
        fld = dataclasses.field()
        fld.name, fld.type, fld._field_type = f, types.get(f, ""), dataclasses._FIELD
        out[f] = fld
    return out


def _make_class(cname, sent):
    """The view class holding `sent` (wire order) of the schema's fields."""
    spec = _SCHEMA[cname]
    order = tuple(spec["fields"])

    def new(cls, *args, **kwargs):  # dataclasses.replace builds a view this way
        values = dict(zip(order, args), **kwargs)
        if set(values) != set(order):
            raise TypeError("%s() takes the fields %s" % (cname, ", ".join(order)))
        return tuple.__new__(cls, [values[f] for f in cls.__view_sent__])

    ns = {"__slots__": (), "__qualname__": cname, "__module__": spec.get("module", "simcore.pcb"),
          "__match_args__": order, "__view_sent__": tuple(sent), "__view_partial__": len(sent) < len(order),
          "__view_order__": None, "__new__": new,
          "__dataclass_fields__": _dataclass_fields(order, spec.get("types", {}))}
    if not ns["__view_partial__"] and tuple(sent) != order:
        ns["__view_order__"] = tuple(sent.index(f) for f in order)
    for i, f in enumerate(sent):
        ns[f] = _tuplegetter(i, None)  # reads slot i directly; refuses assignment; no Python frame
    for f in order:
        if f not in ns:
            ns[f] = _unsent(cname, f)
    for name, (obj, _reads) in _MEMBERS[cname].items():
        ns[name] = obj
    for name in ("count", "index"):  # tuple methods the dataclass does not have
        if name not in ns:
            ns[name] = _not_a_member(cname, name)
    return type(cname, (_View,), ns)


def prepare(schema, builtins_dict, die):
    """Compile the schema's derived members (trusted source from the parent) once."""
    global _SCHEMA, _die
    _SCHEMA, _die = schema, die
    for cname, spec in schema.items():
        members = {}
        for name, m in spec.get("members", {}).items():
            env = {"__builtins__": builtins_dict}
            code = compile(m["source"], "<simcore.pcb.%s.%s>" % (cname, name), "exec",
                           flags=__future__.annotations.compiler_flag, dont_inherit=True)
            exec(code, env)  # noqa: S102 - the simulator's own source
            members[name] = (env[name], tuple(m["reads"]))
        _MEMBERS[cname] = members


def configure(wire):
    """(Re)build the view classes for the fields `wire` (wire.select_fields' result) sends."""
    global ProgramView, InstanceView, Signals, WIRE, N_SCALAR, N_HIST
    pv, iv, sg = (_SCHEMA[c]["fields"] for c in ("ProgramView", "InstanceView", "Signals"))
    hist_all = _SCHEMA["ProgramView"]["history"]
    if set(wire["view"]) - set(pv) or set(wire["hist"]) - set(hist_all) or set(wire["inst"]) - set(iv) \
            or set(wire["signals"] or ()) - set(sg) or not wire["view"] or wire["view"][0] != pv[0]:  # the key of the history deltas
        raise ValueError("protocol: unknown observation fields")
    ProgramView = _make_class("ProgramView", list(wire["view"]) + list(wire["hist"]))
    InstanceView = _make_class("InstanceView", list(wire["inst"]))
    Signals = _make_class("Signals", list(wire["signals"] or ()))
    WIRE = wire
    N_SCALAR = len(wire["view"])
    N_HIST = len(wire["hist"])
    _HISTORY.clear()
    return {"ProgramView": ProgramView, "InstanceView": InstanceView, "Signals": Signals}


def empty_signals():
    """What `self.signals` holds when the source never reads signals: a view with no field sent."""
    return tuple.__new__(Signals, ())


def make_view(row):
    """Rebuild a view from [scalars, (start, items) per history field] (see wire.ViewEncoder).

    The history tuples only grow, so the parent sends each as (start, new items) against
    what it sent last time for that program; the full tuples live here.
    """
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
    """A Signals row (the wired fields in schema order, instances as rows) -> a view."""
    if WIRE["signals"] and WIRE["signals"][-1] == "instances":
        row = row[:-1] + [make_instances(row[-1])]
    return tuple.__new__(Signals, row)
