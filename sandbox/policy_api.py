"""What candidate code may use: the one definition of the import allow-list.

The static gate (sandbox/gate.py) refuses anything else with a message an LLM can act on,
and the worker builds the candidate's namespace from exactly these lists (they travel to
it at spawn, sandbox/process.py), so the two cannot drift apart.

A module listed with "*" offers every public name that is not itself a module (math,
heapq, ...: pure functions of their arguments). The others are curated: functions that take
an attribute name, a namespace or code as *run-time* data are left out, because each is a
getattr/setattr (or an eval) the gate never sees as text:
  functools.update_wrapper / wraps    copy attributes named by strings (`__globals__` ...)
  functools.singledispatch(method)    evaluates string annotations
  dataclasses.make_dataclass           a class from run-time names and a namespace
  enum's functional API (Enum("E", names)) is refused inside the worker
  (sandbox/worker/serve.py), since Enum itself must stay.
The worker is the wall (docs/sandbox.md); these lists keep the gate's feedback specific and
keep reflection out of reach of code that stays in Python.
"""
from __future__ import annotations

import builtins
from typing import Any

ALL = ("*",)

MODULES: dict[str, tuple[str, ...]] = {
    "math": ALL,
    "heapq": ALL,
    "bisect": ALL,
    "itertools": ALL,
    "statistics": ALL,
    "collections": ("ChainMap", "Counter", "OrderedDict", "UserDict", "UserList", "UserString", "defaultdict",
                    "deque", "namedtuple"),
    "functools": ("cache", "cached_property", "cmp_to_key", "lru_cache", "partial", "partialmethod", "reduce",
                  "total_ordering"),
    "dataclasses": ("FrozenInstanceError", "InitVar", "KW_ONLY", "MISSING", "asdict", "astuple", "dataclass",
                    "field", "fields", "is_dataclass", "replace"),
    "enum": ("Enum", "Flag", "IntEnum", "IntFlag", "StrEnum", "auto", "unique"),
}
# `from typing import X` only for these names (annotations); `import typing` is refused.
TYPING_NAMES = ("Any", "Optional", "Union", "Dict", "List", "Tuple", "Set", "FrozenSet", "Iterable", "Iterator",
                "Sequence", "Mapping", "MutableMapping", "ClassVar", "Callable", "DefaultDict", "Deque",
                "NamedTuple")
POLICY_IMPORT_MODULES = ("simcore.policies", "simcore.policies.base")
POLICY_IMPORT_NAMES = ("RetentionPolicy", "SchedulingPolicy", "RoutingPolicy", "ProgramView", "Signals",
                       "InstanceView")

# Exceptions that swallow a kill or an exit: a policy may not name (nor catch) them.
SWALLOWING_EXCEPTIONS = frozenset({"BaseException", "SystemExit", "KeyboardInterrupt", "GeneratorExit"})
_SAFE_FUNCTIONS = (
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "classmethod",
    "complex", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "hash", "hex", "int",
    "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object", "oct", "ord",
    "pow", "property", "range", "repr", "reversed", "round", "set", "slice", "sorted", "staticmethod", "str",
    "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis", "True", "False", "None",
)


def _exception_names() -> tuple[str, ...]:
    """Every builtin exception and warning class, but those that could swallow a kill."""
    return tuple(sorted(n for n, v in vars(builtins).items()
                        if isinstance(v, type) and issubclass(v, BaseException) and not n.startswith("_")
                        and n not in SWALLOWING_EXCEPTIONS and issubclass(v, Exception)))


# The builtins a candidate's module sees (plus a no-op print, __build_class__ and a
# restricted __import__, added by the worker).
SAFE_BUILTIN_NAMES: tuple[str, ...] = _SAFE_FUNCTIONS + _exception_names()


def public_api(module: Any) -> dict[str, Any]:
    """Names of a module that are public and not themselves modules (`statistics.random`,
    `enum.sys` are modules reachable as attributes; handing them out would undo the list)."""
    out = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if type(value) is type(builtins):
            continue
        out[name] = value
    return out


def module_names(module: str) -> tuple[str, ...]:
    """The names `module` offers a candidate (resolving "*" against the installed module)."""
    names = MODULES[module]
    if names == ALL:
        import importlib
        return tuple(sorted(public_api(importlib.import_module(module))))
    return names


def as_wire() -> dict[str, Any]:
    """The lists as plain data for the worker's start-up configuration."""
    return {"modules": {m: list(module_names(m)) for m in MODULES}, "typing": list(TYPING_NAMES),
            "policy_modules": list(POLICY_IMPORT_MODULES), "policy_names": list(POLICY_IMPORT_NAMES),
            "builtins": list(SAFE_BUILTIN_NAMES)}
