"""`evolve runs | leaderboard | show | plot | export`: inspect finished searches, export a winner.

Errors are RunsError (a ConfigError): simcore.cli prints them as one line and exits 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from . import runs as R

# Piped output (CI logs, `| less`) gets wide tables instead of Rich's 80-column default.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if _missing(x) else fmt.format(x)


def _s(x: Any, default: str = "-") -> str:
    return default if _missing(x) or x == "" else str(x)


def _table(title: str, columns: list[str], fold: tuple[str, ...] = ()) -> Table:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, overflow="fold" if c in fold else "ellipsis")
    return t


def cmd_runs(args: argparse.Namespace) -> int:
    df = R.runs_table(R.runs_root(args.runs_dir))
    if args.json:
        print(df.to_json(orient="records"))
        return 0
    if df.empty:
        console.print(f"no runs under {R.runs_root(args.runs_dir)}")
        return 0
    t = _table(f"runs in {R.runs_root(args.runs_dir)}",
               ["run", "axis", "cell", "iterations", "best fitness", "best candidate", "status"],
               fold=("run", "cell", "best candidate"))
    for r in df.itertuples():
        t.add_row(r.run_id, r.axis, r.cell, r.iterations, _f(r.best_fitness, "{:.4f}"), _s(r.best_candidate), r.status)
    console.print(t)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    df = R.candidates(run).head(args.top)
    if args.json:
        print(json.dumps({"run_id": run.run_id, "status": run.status,
                          "candidates": json.loads(df.to_json(orient="records"))}))
        return 0
    t = _table(f"{run.run_id} ({run.axis} on {run.cell}, {run.status}): top {len(df)}",
               ["#", "candidate", "fitness [95% CI]", "mean JCT (s)", "p99 JCT (s)", "island", "gen", "parent",
                "status"], fold=("candidate", "fitness [95% CI]", "parent", "status"))
    for r in df.itertuples():
        ci = f" [{_f(r.fitness_lo, '{:.4f}')}, {_f(r.fitness_hi, '{:.4f}')}]" if r.status == "ok" else ""
        status = r.status if r.status == "ok" else f"{r.status}: {_s(r.reason, '?')}"
        t.add_row(str(r.rank), r.candidate_id, f"{r.fitness:.4f}{ci}", _f(r.mean_jct_s, "{:,.1f}"),
                  _f(r.p99_jct_s, "{:,.1f}"), _f(r.island, "{:.0f}"), _f(r.generation, "{:.0f}"),
                  _s(r.parent_id, "(seed)"), status)
    console.print(t)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    source, result = R.candidate(run, args.candidate)
    cid = str(result.get("candidate_id", args.candidate))
    console.rule(f"{run.run_id} / {cid}: {result.get('status')}"
                 + (f" ({result.get('reason')})" if result.get("reason") else ""))
    diff = R.seed_diff(run, source, cid)
    console.print(Syntax(diff, "diff", word_wrap=True) if diff else "(identical to the seed)")
    t = Table(title="metrics", show_header=False)
    t.add_row("fitness", f"{float(result.get('fitness') or 0):.4f} "
                         f"[{', '.join(_f(x, '{:.4f}') for x in (result.get('fitness_ci') or []))}]")
    for k, v in sorted((result.get("metrics") or {}).items()):
        t.add_row(k, _f(v, "{:,.4g}") if isinstance(v, (int, float)) else str(v))
    console.print(t)
    chain = R.lineage(run, cid)
    console.print("lineage: " + " <- ".join(
        f"{r['candidate_id']} (it {r.get('iteration', '?')}, fit {_f(r.get('fitness'))})"
        if r.get("status") != "missing" else f"{r['candidate_id']} (missing)" for r in chain)
        + ("  (seed)" if chain and chain[-1].get("parent_id") is None and chain[-1].get("status") != "missing"
           else ""), markup=False)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .plots import plot_run
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    run.require_finished("plot")
    _, result = R.candidate(run, args.candidate)
    R.require_ok(run, result)
    cid = result["candidate_id"]
    out = plot_run(run, run.root / "candidates" / cid / "program.py",
                   _out_dir(args.out, run.root / "plots"))
    for p in out:
        console.print(f"wrote {p}")
    return 0


def _out_dir(value: str | None, default: Any) -> Any:
    from pathlib import Path
    return Path(value) if value else default


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_run
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    pkg = export_run(run, args.candidate, args.to, _out_dir(args.out, None), name=args.name, force=args.force,
                     force_inadmissible=args.force_inadmissible)
    console.print(f"exported {run.run_id}/{pkg.candidate_id} ({run.axis}) to {pkg.out} as package "
                  f"'{pkg.package}'; see {pkg.out / 'README.md'}", markup=False)
    for line in pkg.summary():
        console.print(line, markup=False)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", metavar="DIR", help=f"runs root (default ${R.ENV_RUNS} or ./runs)")


def register(sub: Any) -> None:
    p = sub.add_parser("runs", help="list search runs")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("leaderboard", help="a run's candidates, best first")
    p.add_argument("run", nargs="?", help="run id or directory (default: the latest run)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true")
    _common(p)
    p.set_defaults(func=cmd_leaderboard)
    p = sub.add_parser("show", help="one candidate: diff against the seed, metrics, lineage")
    p.add_argument("run")
    p.add_argument("candidate")
    _common(p)
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("plot", help="PNGs: fitness per island, JCT CDF and KV utilisation of best vs seed")
    p.add_argument("run")
    p.add_argument("--candidate", help="plot this candidate instead of the run's best")
    p.add_argument("--out", metavar="DIR", help="default: RUN/plots")
    _common(p)
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("export", help="export a candidate as an installable vLLM package")
    p.add_argument("run")
    p.add_argument("--candidate", help="default: the run's best")
    p.add_argument("--to", choices=["vllm"], default="vllm")
    p.add_argument("--out", metavar="DIR", required=True)
    p.add_argument("--name", help="Python package name (default derived from axis and candidate)")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty DIR")
    p.add_argument("--force-inadmissible", action="store_true",
                   help="export even if the sandbox's admission check now rejects the file (recorded)")
    _common(p)
    p.set_defaults(func=cmd_export)


def run(args: argparse.Namespace) -> int:
    return int(args.func(args) or 0)
