"""Static AST gate: the first layer, before any candidate code runs.

It refuses what a serving policy never needs and every known escape route needs:
imports outside the allow-list, dunder names/attributes/strings (except `__init__`),
frame/code/generator internals, reflective builtins, `str.format` traversal, handlers
that could swallow a kill, and oversized sources. The reason is one line, phrased as
feedback an LLM can act on. The gate is not the wall (the worker process is); it keeps
obvious escapes out and keeps the search's feedback specific.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from simcore.policies.base import AXES
from simcore.policies.base import AXIS_BASES as _BASE_CLASSES

from . import policy_api
from .errors import SandboxViolation
from .policy_api import SWALLOWING_EXCEPTIONS

MAX_SOURCE_CHARS = 64 * 1024
MAX_NODES = 20_000

AXIS_BASES = {axis: cls.__name__ for axis, cls in _BASE_CLASSES.items()}

FORBIDDEN_NAMES = frozenset({
    "getattr", "setattr", "delattr", "hasattr", "vars", "dir", "globals", "locals", "type",
    "eval", "exec", "compile", "open", "input", "breakpoint", "help", "memoryview", "id",
    "exit", "quit", "format", "copyright", "credits", "license",
})
# Non-dunder attributes that lead to frames, code objects or interpreter internals.
FORBIDDEN_ATTRS = frozenset({
    "format", "format_map",
    "f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_lasti", "f_lineno",
    "f_trace", "f_trace_lines", "f_trace_opcodes",
    "gi_frame", "gi_code", "gi_running", "gi_yieldfrom", "gi_suspended",
    "cr_frame", "cr_code", "cr_await", "cr_origin", "cr_running", "cr_suspended",
    "ag_frame", "ag_code", "ag_await", "ag_running",
    "tb_frame", "tb_next", "tb_lasti", "tb_lineno",
    "co_code", "co_consts", "co_names", "co_varnames", "co_filename", "co_firstlineno",
    "co_lnotab", "co_freevars", "co_cellvars", "co_linetable", "co_exceptiontable",
    "co_positions", "co_lines", "co_qualname", "co_name",
    "cell_contents", "func_globals", "func_code", "im_func", "im_self", "mro",
    "_getframe", "_current_frames", "f_restricted",
})

_ALLOWED_NODES = tuple(getattr(ast, n) for n in (
    "Module", "Expr", "Import", "ImportFrom", "alias", "ClassDef", "FunctionDef", "Return",
    "Assign", "AugAssign", "AnnAssign", "For", "While", "If", "Raise", "Try", "ExceptHandler",
    "Assert", "Pass", "Break", "Continue", "Delete", "Global", "Nonlocal",
    "BoolOp", "BinOp", "UnaryOp", "Lambda", "IfExp", "Dict", "Set", "ListComp", "SetComp",
    "DictComp", "GeneratorExp", "comprehension", "Yield", "Compare", "Call", "keyword",
    "Constant", "Attribute", "Subscript", "Starred", "Name", "List", "Tuple", "Slice",
    "NamedExpr", "JoinedStr", "FormattedValue", "arguments", "arg",
    "Load", "Store", "Del", "And", "Or", "Add", "Sub", "Mult", "MatMult", "Div", "Mod", "Pow",
    "LShift", "RShift", "BitOr", "BitXor", "BitAnd", "FloorDiv", "Invert", "Not", "UAdd",
    "USub", "Eq", "NotEq", "Lt", "LtE", "Gt", "GtE", "Is", "IsNot", "In", "NotIn",
))


@dataclass(frozen=True)
class GateResult:
    class_name: str
    axis: str
    # every `.attribute` name in the source, or None when the source may read whole views
    # (repr/str/ascii/hash, f-strings); see observed_names
    observed_names: frozenset | None = None


def _public_api_names() -> dict[str, frozenset[str]]:
    return {m: frozenset(policy_api.module_names(m)) for m in policy_api.MODULES}


_API: dict[str, frozenset[str]] | None = None


def _api() -> dict[str, frozenset[str]]:
    global _API
    if _API is None:
        _API = _public_api_names()
    return _API


def _dunder(s: str) -> bool:
    return "__" in s.replace("__init__", "")


class _Reject(Exception):
    pass


def _where(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


def _check_import(node: ast.AST, module_aliases: dict[str, str]) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name not in policy_api.MODULES:
                raise _Reject(f"{_where(node)}: import of '{a.name}' is not allowed; allowed modules: "
                              f"{', '.join(policy_api.MODULES)}")
            module_aliases[a.asname or a.name] = a.name
        return
    assert isinstance(node, ast.ImportFrom)
    mod = node.module or ""
    if node.level:
        raise _Reject(f"{_where(node)}: relative imports are not allowed")
    names = [a.name for a in node.names]
    if "*" in names:
        raise _Reject(f"{_where(node)}: 'from {mod} import *' is not allowed; name what you use")
    if mod == "__future__":
        if names != ["annotations"]:
            raise _Reject(f"{_where(node)}: only 'from __future__ import annotations' is allowed")
        return
    if mod == "typing":
        allowed = policy_api.TYPING_NAMES
    elif mod in policy_api.POLICY_IMPORT_MODULES:
        allowed = policy_api.POLICY_IMPORT_NAMES
    elif mod in policy_api.MODULES:
        allowed = tuple(_api()[mod])
    else:
        raise _Reject(f"{_where(node)}: import from '{mod}' is not allowed; allowed modules: "
                      f"{', '.join(policy_api.MODULES)}")
    for n in names:
        if n not in allowed:
            raise _Reject(f"{_where(node)}: '{n}' cannot be imported from '{mod}' in a policy")


def _check_node(node: ast.AST, module_aliases: dict[str, str]) -> None:
    if not isinstance(node, _ALLOWED_NODES):
        raise _Reject(f"{_where(node)}: {type(node).__name__} statements/expressions are not allowed "
                      "in a policy")
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        _check_import(node, module_aliases)
    elif isinstance(node, ast.Name):
        if _dunder(node.id):
            raise _Reject(f"{_where(node)}: dunder name '{node.id}' is not allowed")
        if node.id in FORBIDDEN_NAMES:
            raise _Reject(f"{_where(node)}: '{node.id}' is not available to policies "
                          "(reflection, I/O and dynamic code are refused)")
    elif isinstance(node, ast.Attribute):
        if _dunder(node.attr):
            raise _Reject(f"{_where(node)}: dunder attribute '.{node.attr}' is not allowed")
        if node.attr in FORBIDDEN_ATTRS:
            raise _Reject(f"{_where(node)}: attribute '.{node.attr}' is not allowed in a policy")
        if isinstance(node.value, ast.Name) and node.value.id in module_aliases:
            mod = module_aliases[node.value.id]
            if node.attr not in _api()[mod]:
                raise _Reject(f"{_where(node)}: '{mod}.{node.attr}' is not available to policies")
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, str) and _dunder(v):
            raise _Reject(f"{_where(node)}: strings containing '__' are not allowed")
        if isinstance(v, bytes) and b"__" in v.replace(b"__init__", b""):
            raise _Reject(f"{_where(node)}: bytes containing '__' are not allowed")
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        if _dunder(node.name):
            raise _Reject(f"{_where(node)}: dunder name '{node.name}' is not allowed (only __init__)")
        if isinstance(node, ast.ClassDef) and node.keywords:
            raise _Reject(f"{_where(node)}: class keywords (metaclass=...) are not allowed")
    elif isinstance(node, ast.arg):
        if _dunder(node.arg):
            raise _Reject(f"{_where(node)}: dunder argument '{node.arg}' is not allowed")
    elif isinstance(node, ast.keyword):
        if node.arg is not None and _dunder(node.arg):
            raise _Reject(f"{_where(node)}: dunder keyword '{node.arg}' is not allowed")
    elif isinstance(node, ast.alias):
        if _dunder(node.name) and node.name != "__future__" or (node.asname and _dunder(node.asname)):
            raise _Reject(f"{_where(node)}: dunder import alias is not allowed")
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        for n in node.names:
            if _dunder(n):
                raise _Reject(f"{_where(node)}: dunder name '{n}' is not allowed")
    elif isinstance(node, ast.ExceptHandler):
        if node.type is None:
            raise _Reject(f"{_where(node)}: bare 'except:' is not allowed; catch Exception or narrower")
        types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        for t in types:
            if isinstance(t, ast.Name) and t.id in SWALLOWING_EXCEPTIONS:
                raise _Reject(f"{_where(node)}: 'except {t.id}' is not allowed; catch Exception or narrower")


def _policy_class(tree: ast.Module, axis: str) -> str:
    found: list[tuple[str, str]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if isinstance(b, ast.Name) and b.id in AXIS_BASES.values():
                    found.append((node.name, b.id))
    want = AXIS_BASES[axis]
    if not found:
        raise _Reject(f"no policy class: define one top-level class that subclasses {want}")
    if len(found) > 1:
        raise _Reject(f"{len(found)} policy classes defined ({', '.join(n for n, _ in found)}); "
                      "define exactly one")
    name, base = found[0]
    if base != want:
        raise _Reject(f"class {name} subclasses {base}, but the axis is '{axis}' (expected {want})")
    return name


_WHOLE_VIEW_NAMES = frozenset({"repr", "str", "ascii", "hash"})


def observed_names(nodes: list[ast.AST]) -> frozenset[str] | None:
    """The attribute names a gated candidate can read: with getattr, vars, dunders and
    `.format` refused, a field is reachable only as `x.name` written in the source. None
    when the source can turn a whole view into text or a hash (then everything is sent, so
    the text is what it would be in-process)."""
    names = set()
    for n in nodes:
        if isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, ast.FunctionDef):
            names.add(n.name)  # an overridden `bind` receives the signals
        elif isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Name) and n.id in _WHOLE_VIEW_NAMES) \
                or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                    and isinstance(n.left, ast.Constant) and isinstance(n.left.value, str)):
            return None  # f-strings, str()/repr()/hash(), `"%s" % x`
    return frozenset(names)


def check_source(source: str, axis: str) -> GateResult:
    """Raise SandboxViolation with a one-line reason unless `source` passes the gate."""
    if axis not in AXIS_BASES:
        raise SandboxViolation(f"unknown policy axis '{axis}' (expected {', '.join(AXES)})")
    if not isinstance(source, str):
        raise SandboxViolation("policy source must be text")
    if len(source) > MAX_SOURCE_CHARS:
        raise SandboxViolation(f"policy source is {len(source)} characters; the limit is {MAX_SOURCE_CHARS}")
    try:
        tree = ast.parse(source, "<candidate>", "exec")
    except SyntaxError as e:
        raise SandboxViolation(f"syntax error at line {e.lineno}: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise SandboxViolation(f"policy source cannot be parsed: {type(e).__name__}") from None
    try:
        nodes = list(ast.walk(tree))
        if len(nodes) > MAX_NODES:
            raise _Reject(f"policy has {len(nodes)} syntax nodes; the limit is {MAX_NODES}")
        module_aliases: dict[str, str] = {}
        # imports first, so that `module.attr` checks know every alias
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                _check_import(node, module_aliases)
        # report the first offence in source order: that is where an LLM should look
        # (innermost first among nodes starting at the same place: `e.__traceback__` before
        # `e.__traceback__.tb_frame`)
        # nodes without a position (withitem, comprehension, operators) go last: their
        # parent statement carries the line number
        nodes.sort(key=lambda n: (getattr(n, "lineno", 1 << 30), getattr(n, "col_offset", 0),
                                  getattr(n, "end_lineno", 0) or 0, getattr(n, "end_col_offset", 0) or 0))
        for node in nodes:
            _check_node(node, module_aliases)
        name = _policy_class(tree, axis)
    except _Reject as e:
        raise SandboxViolation(f"rejected by the static gate: {e}") from None
    except RecursionError:
        raise SandboxViolation("rejected by the static gate: policy source is nested too deeply") from None
    return GateResult(name, axis, observed_names(nodes))
