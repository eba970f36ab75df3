"""Admission of candidate source: the one place the evaluator talks to `sandbox/`.

Three checks run before a candidate is simulated, each raising `Rejected` with a one-line
reason that is stored with the candidate and fed back to the LLM:
  markers  - the text outside the EVOLVE blocks must equal the seed's (OpenEvolve 0.4.0
             does not enforce the markers itself);
  gate     - static AST gate (imports, dunders, dangerous builtins);
  leakage  - the candidate may read only the causal observation fields.
`load_policy` turns admitted source into a policy object for the simulator.

The sandbox package provides the real implementations (`sandbox.markers`, `sandbox.gate`,
`sandbox.leakage`, `sandbox.client.load_sandboxed_policy`). Where a module is not there
yet, a conservative built-in fallback below is used instead, and `backend()` says which.
"""
from __future__ import annotations

import ast
import importlib
from typing import Any

from simcore.pcb import OBSERVABLE_INSTANCE_FIELDS, OBSERVABLE_PCB_FIELDS, OBSERVABLE_SIGNAL_FIELDS

START = "# EVOLVE-BLOCK-START"
END = "# EVOLVE-BLOCK-END"


class Rejected(Exception):
    """A candidate failed an admission check; `kind` is markers|gate|leak|load."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(" ".join(f"{kind}: {reason}".split()))
        self.kind = kind
        self.reason = " ".join(str(reason).split())


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def backend() -> dict[str, str]:
    """Which implementation each check uses ('sandbox' or 'fallback')."""
    return {m: ("sandbox" if _optional(f"sandbox.{m}") is not None else "fallback")
            for m in ("markers", "gate", "leakage", "client")}


# --------------------------------------------------------------------------- markers
def _outside_blocks(source: str) -> tuple[list[str], int]:
    outside: list[str] = []
    depth = blocks = 0
    for lineno, line in enumerate(source.splitlines(), 1):
        s = line.strip()
        if s == START:
            if depth:
                raise Rejected("markers", f"line {lineno}: nested {START}")
            depth, blocks = 1, blocks + 1
            outside.append(START)
        elif s == END:
            if not depth:
                raise Rejected("markers", f"line {lineno}: {END} without {START}")
            depth = 0
            outside.append(END)
        elif not depth:
            outside.append(line.rstrip())
    if depth:
        raise Rejected("markers", f"{START} is never closed")
    return outside, blocks


def check_markers(source: str, seed_source: str) -> None:
    """Reject a candidate whose text outside the EVOLVE blocks differs from the seed's."""
    mod = _optional("sandbox.markers")
    if mod is not None and hasattr(mod, "check_markers"):
        try:
            mod.check_markers(source, seed_source)
        except Exception as e:  # noqa: BLE001 - any sandbox rejection becomes feedback
            raise Rejected("markers", str(e)) from None
        return
    want, nb = _outside_blocks(seed_source)
    got, _ = _outside_blocks(source)
    if got == want:
        return
    if sum(1 for x in got if x == START) != nb:
        raise Rejected("markers", f"the file must keep exactly {nb} EVOLVE block(s)")
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            raise Rejected("markers", f"edited outside the EVOLVE block: {a.strip()[:80]!r} "
                                      f"(seed has {b.strip()[:80]!r}); only the block may change")
    raise Rejected("markers", "added or removed lines outside the EVOLVE block; only the block may change")


# --------------------------------------------------------------------------- gate
_ALLOWED_IMPORTS = {"math", "heapq", "bisect", "collections", "itertools", "functools",
                    "statistics", "dataclasses", "enum"}
_BANNED_NAMES = {"getattr", "setattr", "delattr", "vars", "dir", "globals", "locals", "type",
                 "eval", "exec", "compile", "open", "__import__", "input", "breakpoint",
                 "memoryview"}
_MAX_SOURCE = 64 * 1024


def _fallback_gate(source: str) -> None:
    if len(source) > _MAX_SOURCE:
        raise Rejected("gate", f"source is {len(source)} bytes, limit {_MAX_SOURCE}")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise Rejected("gate", f"line {e.lineno}: syntax error: {e.msg}") from None
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if n.split(".")[0] not in _ALLOWED_IMPORTS:
                    raise Rejected("gate", f"line {line}: import of '{n}' is not allowed "
                                           f"(allowed: {', '.join(sorted(_ALLOWED_IMPORTS))})")
        elif isinstance(node, ast.Name) and node.id in _BANNED_NAMES:
            raise Rejected("gate", f"line {line}: use of '{node.id}' is not allowed")
        elif isinstance(node, ast.Name) and node.id.startswith("__"):
            raise Rejected("gate", f"line {line}: dunder name '{node.id}' is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr != "__init__":
            raise Rejected("gate", f"line {line}: private/dunder attribute '.{node.attr}' is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr == "format":
            raise Rejected("gate", f"line {line}: '.format' is not allowed")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            raise Rejected("gate", f"line {line}: strings containing '__' are not allowed")
        elif isinstance(node, ast.ExceptHandler) and node.type is None:
            raise Rejected("gate", f"line {line}: bare 'except:' is not allowed")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            raise Rejected("gate", f"line {line}: global/nonlocal is not allowed")


def gate(source: str, axis: str) -> None:
    """Static gate: reject dangerous source before anything runs."""
    mod = _optional("sandbox.gate")
    if mod is not None and hasattr(mod, "check_source"):
        try:
            mod.check_source(source, axis)
        except Exception as e:  # noqa: BLE001
            raise Rejected("gate", str(e)) from None
        return
    _fallback_gate(source)


# --------------------------------------------------------------------------- leakage
_PCB_METHODS = {"gap_elapsed_s"}
_INSTANCE_OK = OBSERVABLE_INSTANCE_FIELDS | {"inflight"}


def _fallback_leakage(source: str) -> None:
    """Static allow-list: attributes read off `pcb`, `self.signals` and instance views."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "pcb":
            if node.attr not in OBSERVABLE_PCB_FIELDS | _PCB_METHODS:
                raise Rejected("leak", f"line {node.lineno}: pcb.{node.attr} is not an observable "
                                       "field (see OBSERVABLE_PCB_FIELDS)")
        elif (isinstance(base, ast.Attribute) and base.attr == "signals"
              and isinstance(base.value, ast.Name) and base.value.id == "self"):
            if node.attr not in OBSERVABLE_SIGNAL_FIELDS:
                raise Rejected("leak", f"line {node.lineno}: self.signals.{node.attr} is not an "
                                       "observable signal")


def check_leakage_static(source: str) -> None:
    """Cheap static part: attributes read off `pcb` and `self.signals` must be observable."""
    _fallback_leakage(source)


def check_leakage(source: str, axis: str, cell: str, seed: int, simulate_fn: Any = None) -> None:
    """Counterfactual leakage test (sandbox.leakage): decisions must not change when only
    not-yet-revealed future values of the trace are perturbed."""
    check_leakage_static(source)
    mod = _optional("sandbox.leakage")
    if mod is None or not hasattr(mod, "check_leakage"):
        return
    from simcore.config import get_cell
    from simcore.sim import cell_programs
    c = get_cell(cell)
    try:
        report = mod.check_leakage(lambda _progs: load_policy(source, axis), axis, c,
                                   cell_programs(c, seed), seed=seed, simulate_fn=simulate_fn)
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001 - a crash during the test is the candidate's fault
        raise Rejected("crash", f"during the leakage test: {type(e).__name__}: {e}") from None
    if not report.ok:
        raise Rejected("leak", report.reason)


# --------------------------------------------------------------------------- loading
def load_policy(source: str, axis: str) -> Any:
    """A policy object for `axis` from admitted source (sandboxed where available)."""
    mod = _optional("sandbox.client")
    try:
        if mod is not None and hasattr(mod, "load_sandboxed_policy"):
            return mod.load_sandboxed_policy(source, axis)
        from simcore.policies.registry import policy_class_from_source
        return policy_class_from_source(source, axis, "<candidate>")()
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001 - load failures are candidate feedback
        raise Rejected("load", f"{type(e).__name__}: {e}") from None


def admit(source: str, axis: str, seed_source: str) -> None:
    """All static admission checks, cheapest first (the counterfactual leak test runs later,
    in the evaluation task, because it simulates)."""
    check_markers(source, seed_source)
    gate(source, axis)
    check_leakage_static(source)
