"""`evolve check`: is a policy file admissible? gate -> markers -> sandboxed smoke run -> leakage.

    evolve check FILE --axis retention|scheduling|routing [--seed-file SEED] [--cell C] [--json]
                 [--allow-weak-sandbox]

Exit status 0 only when every stage passes; 1 when the policy is rejected (the reason is
one line, fit to feed back to an LLM); 2 when the command itself is misused (missing file,
unknown cell) or the machine lacks an isolation layer and --allow-weak-sandbox is not
given. A shipped policy name instead of FILE checks that trusted policy in-process (smoke
run and leakage check only: it is not candidate code).

From Python: `check_policy(source, axis, label=...)` returns a `Verdict` (`.admissible`,
`.reason`, `.stages`, `.layers`, `.to_json()`); it raises SandboxUnavailable where a layer
is missing and weak sandboxes are not allowed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simcore.config import Cell, ConfigError, get_cell
from simcore.policies.base import AXES, PolicyError
from simcore.textio import read_text
from simcore.workload import WorkloadError

from .client import DEFAULT_CPU_BUDGET_S, DEFAULT_DECISION_TIMEOUT_S, load_sandboxed_policy
from .errors import SandboxUnavailable, SandboxViolation
from .gate import check_source
from .leakage import check_leakage, exercising_cell
from .markers import check_markers
from .text import safe_text

DEFAULT_CELL = "rtx70b_swe10_0.1"


@dataclass
class Stage:
    stage: str
    ok: bool | None          # None = skipped
    detail: str
    seconds: float = 0.0


@dataclass
class Verdict:
    policy: str
    axis: str
    cell: str
    admissible: bool = False
    reason: str = ""
    stages: list[Stage] = field(default_factory=list)
    layers: dict[str, str] = field(default_factory=dict)   # isolation layers of the worker: "on ..." | "off: why"
    layout: str = ""  # the worker's address-space layout (sandbox/layout.py): "mirrored" or "off: why"
    allow_weak_sandbox: bool = False  # whether a worker lacking a layer was accepted
    in_process: bool = False          # a shipped (trusted) policy, run in this process

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


smoke_cell = exercising_cell  # the routing axis is only exercised with two instances or more


def check_policy(source: str | None, axis: str, *, label: str, seed_source: str | None = None,
                 cell: str | Cell = DEFAULT_CELL, shipped: str | None = None,
                 decision_timeout_s: float = DEFAULT_DECISION_TIMEOUT_S,
                 cpu_budget_s: float = DEFAULT_CPU_BUDGET_S, allow_weak_sandbox: bool = False) -> Verdict:
    """Run every stage; stops at the first failure. `shipped` names a trusted policy.

    The admission verdict of a policy file: `evolve check` prints it, the export records it.
    Raises SandboxUnavailable (not a verdict: the machine, not the policy) where an
    isolation layer is missing and `allow_weak_sandbox` is false.
    """
    from simcore.policies.registry import load_policy
    from simcore.sim import SimulationError, cell_programs, simulate

    base_cell = get_cell(cell) if isinstance(cell, str) else cell
    c = smoke_cell(base_cell, axis)
    v = Verdict(safe_text(label, 300), axis, c.name, allow_weak_sandbox=allow_weak_sandbox,
                in_process=shipped is not None)

    def stage(name: str, fn) -> bool:
        t = time.perf_counter()
        try:
            detail = fn()
            ok = True
        except SandboxUnavailable:
            raise
        except (SandboxViolation, PolicyError, SimulationError, WorkloadError) as e:
            ok, detail = False, safe_text(e)
        except RecursionError:
            ok, detail = False, "nested too deeply (RecursionError)"
        except _Skip as e:
            ok, detail = None, str(e)
        v.stages.append(Stage(name, ok, detail, round(time.perf_counter() - t, 3)))
        if ok is False:
            v.reason = f"{name}: {detail}"
        return ok is not False

    def make(_programs=None) -> Any:
        if shipped is not None:
            return load_policy(axis, shipped)
        return load_sandboxed_policy(source, axis, decision_timeout_s=decision_timeout_s,  # type: ignore[arg-type]
                                     cpu_budget_s=cpu_budget_s, allow_weak_sandbox=allow_weak_sandbox)

    def gate() -> str:
        if shipped is not None:
            raise _Skip("shipped policy: trusted code, runs in-process")
        r = check_source(source, axis)  # type: ignore[arg-type]
        return f"class {r.class_name} ({axis})"

    def markers() -> str:
        if seed_source is None:
            raise _Skip("no --seed-file given")
        check_markers(source, seed_source)  # type: ignore[arg-type]
        return "only the EVOLVE blocks differ from the seed"

    programs: list = []

    def smoke() -> str:
        programs.extend(cell_programs(c, c.seed))
        pol = make()
        log: list = []
        v.layers = dict(getattr(pol, "sandbox_layers", {}) or {})
        v.layout = str(getattr(pol, "sandbox_layout", "") or "")
        try:
            res = simulate(c, programs=programs, decision_log=log, **{axis: pol})
            flush = getattr(pol, "flush", None)
            if callable(flush):
                flush()  # a posted call's failure must not go unread
        finally:
            close = getattr(pol, "close", None)
            if callable(close):
                close()
        mine = sum(1 for e in log if e[1] == axis)
        if mine == 0:
            raise PolicyError(f"the policy was never called on {c.name}")
        return (f"{c.name}: {res.summary['programs']} programs, mean JCT {res.summary['mean_jct_s']:.1f} s, "
                f"{mine} {axis} decisions")

    def leakage() -> str:
        rep = check_leakage(make, axis, c, programs)
        if not rep.ok:
            raise PolicyError(rep.reason)
        return safe_text(rep.reason)

    for name, fn in (("gate", gate), ("markers", markers), ("smoke", smoke), ("leakage", leakage)):
        if not stage(name, fn):
            return v
    v.admissible = True
    v.reason = "admissible"
    return v


class _Skip(Exception):
    pass


# --------------------------------------------------------------------------- CLI
def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("check", help="check that a policy file is admissible (sandbox + leakage)",
                              description=__doc__.splitlines()[0])
    p.add_argument("file", metavar="FILE", help="policy .py file (or a shipped policy name)")
    p.add_argument("--axis", required=True, choices=AXES)
    p.add_argument("--seed-file", metavar="SEED", help="the seed the candidate was evolved from")
    p.add_argument("--cell", default=DEFAULT_CELL, help=f"smoke/leakage cell (default {DEFAULT_CELL})")
    p.add_argument("--decision-timeout", type=float, default=DEFAULT_DECISION_TIMEOUT_S, metavar="S",
                   help="wall-clock limit per decision (s)")
    p.add_argument("--cpu-budget", type=float, default=DEFAULT_CPU_BUDGET_S, metavar="S",
                   help="CPU seconds per sandboxed run")
    p.add_argument("--allow-weak-sandbox", action="store_true",
                   help="run the candidate even where an isolation layer is unavailable on this machine "
                        "(the missing layers are printed)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=run)
    return p


def _read(path: str, what: str) -> str:
    return read_text(path, _UsageError, f"{what} file")


class _UsageError(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    from simcore.policies.registry import SHIPPED
    try:
        if args.decision_timeout <= 0 or args.cpu_budget <= 0:
            raise _UsageError("--decision-timeout and --cpu-budget must be positive")
        shipped = args.file if (args.file in SHIPPED[args.axis] and not Path(args.file).exists()) else None
        source = None if shipped else _read(args.file, "policy")
        seed = _read(args.seed_file, "seed") if args.seed_file else None
        try:
            cell = get_cell(args.cell)
        except ConfigError as e:
            raise _UsageError(str(e)) from None
    except _UsageError as e:
        print(f"evolve check: error: {e}", file=sys.stderr)
        return 2
    try:
        v = check_policy(source, args.axis, label=args.file, seed_source=seed, cell=cell, shipped=shipped,
                         decision_timeout_s=args.decision_timeout, cpu_budget_s=args.cpu_budget,
                         allow_weak_sandbox=args.allow_weak_sandbox)
    except SandboxUnavailable as e:
        print(f"evolve check: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(v.to_json(), indent=2))
    else:
        for s in v.stages:
            mark = "skip" if s.ok is None else ("ok" if s.ok else "FAIL")
            print(f"{s.stage:8s} {mark:4s}  {s.detail}")
        for line in isolation_lines(v):
            print(line)
        print("verdict: ADMISSIBLE" if v.admissible else f"verdict: REJECTED ({v.reason})")
    return 0 if v.admissible else 1


def isolation_lines(v: Verdict) -> list[str]:
    """What protected the run: the layers that were on, and every one that was off."""
    if v.in_process:
        return ["isolation: none: a shipped policy is trusted code and runs in this process"]
    if not v.layers:
        return []
    on = [k + (f" {val[3:]}" if len(val) > 2 else "") for k, val in v.layers.items() if val.startswith("on")]
    off = [f"{k} ({val[5:]})" for k, val in v.layers.items() if not val.startswith("on")]
    out = ["isolation: on: " + ", ".join(on)]
    if off:
        out.append("isolation: OFF: " + "; ".join(off) +
                   (" -- accepted by --allow-weak-sandbox" if v.allow_weak_sandbox else ""))
    if v.layout:
        out.append(f"layout: {v.layout}")
    return out

