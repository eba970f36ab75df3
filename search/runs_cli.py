"""`evolve runs | leaderboard | show | plot | export`: inspect searches, export a winner.

Errors are RunsError (a ConfigError): simcore.cli prints them as one line and exits 2.
Every table has `--json`; identifiers (run ids, candidate ids, cells) are never cut: their
columns keep their full width and the other columns wrap. Text that users, LLMs or
candidates wrote is shown as plain text, never parsed as Rich markup.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from simcore.display import print_table, stdout_console, strip_control

from . import runs as R

console = stdout_console()


def _emit(title: str, columns: list[str], rows: list[list[Any]], ids: tuple[str, ...]) -> None:
    print_table(console, title, columns, rows, ids)


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if _missing(x) else fmt.format(x)


def _s(x: Any, default: str = "-") -> str:
    return default if _missing(x) or x == "" else strip_control(x)


def _ci(f: Any, lo: Any, hi: Any) -> str:
    return "-" if _missing(f) else f"{f:.4f} [{_f(lo, '{:.4f}')}, {_f(hi, '{:.4f}')}]"


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, default=str))


def cmd_runs(args: argparse.Namespace) -> int:
    base = R.runs_root(args.runs_dir)
    df = R.runs_table(base)
    if args.json:
        _print_json(json.loads(df.to_json(orient="records")))
        return 0
    if df.empty:
        console.print(Text(f"no runs under {base}"))
        return 0
    rows = []
    for r in df.itertuples():
        best = "-" if _missing(r.best_fitness) else f"{_s(r.best_candidate)} {r.best_fitness:.4f} (lo {r.best_lo:.4f})"
        ho = "-" if _missing(r.heldout_fitness) else (f"{r.heldout_fitness:.4f} (lo {r.heldout_lo:.4f})"
                                                      + (" n.s." if _missing(r.winner) else " winner"))
        status = r.status if _missing(r.error) else f"{r.status}: {r.error}"
        rows.append([r.run_id, _s(r.cell), _s(r.axis), _s(r.fixed), _s(r.llm), _s(r.iterations), best, ho,
                     _f(r.llm_failures, "{:.0f}"), _f(r.failed_candidates, "{:.0f}"), status,
                     "WEAK (--allow-weak-sandbox)" if r.sandbox == "weak" else _s(r.sandbox)])
    _emit(f"runs in {base}", ["run", "cell", "axis", "fixed", "llm", "iter", "best (in-sample)", "held-out",
                              "LLM fail", "failed cand", "status", "sandbox"], rows, ("run", "cell"))
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    if args.top is not None and args.top <= 0:
        raise R.RunsError(f"--top {args.top}: must be a positive number")
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    df = R.candidates(run).head(args.top)
    if args.json:
        _print_json({"run_id": run.run_id, "status": run.status, "winner": run.meta.winner,
                     "verdict": run.meta.verdict, "allow_weak_sandbox": run.allow_weak_sandbox,
                     "candidates": json.loads(df.to_json(orient="records"))})
        return 0
    weak = ", WEAK SANDBOX (--allow-weak-sandbox)" if run.allow_weak_sandbox else ""
    rows = []
    for r in df.itertuples():
        ok = r.status == "ok"
        ho = _ci(r.heldout_fitness, r.heldout_lo, r.heldout_hi)
        if not _missing(r.heldout_fitness):
            ho += " *" if r.heldout_significant else " n.s."
        status = "ok" if ok else f"{r.failure_kind}: {_s(r.reason, '?')}"
        if ok and not _missing(r.note):
            status = f"ok ({r.note})"
        rows.append([str(r.rank), r.candidate_id, _ci(r.fitness, r.fitness_lo, r.fitness_hi) if ok else "0",
                     ho, _f(r.mean_jct_s, "{:,.1f}"), _f(r.island, "{:.0f}"), _f(r.generation, "{:.0f}"),
                     _s(r.parent_id, "(seed)"), _s(r.model), status])
    _emit(f"{run.run_id} ({run.axis} on {run.cell}, {run.status}{weak}): top {len(df)}",
          ["#", "candidate", "in-sample fitness [95% CI]", "held-out [CI]", "mean JCT (s)", "island", "gen",
           "parent", "model", "status"], rows, ("candidate", "parent"))
    if run.meta.verdict:
        console.print(Text(("winner: " if run.meta.winner else "result: ") + strip_control(run.meta.verdict)))
    console.print(Text("* = held-out interval above 1.0 (significant); n.s. = not significant"), style="dim")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    source, result = R.candidate(run, args.candidate)
    cid = str(result["candidate_id"])
    rec = R.journal(run, int(result.get("iteration") or 0))
    diff = R.seed_diff(run, source, cid)
    if args.json:
        _print_json({"run_id": run.run_id, "fixed_policies": run.fixed_policies, "result": result,
                     "diff": diff, "journal": rec.model_dump(mode="json") if rec else None})
        return 0
    status = result.get("status")
    head = f"{run.run_id} / {cid}: {status}" + (f" ({result.get('reason')})" if result.get("reason") else "")
    if cid == run.meta.best_candidate:
        head += "  [the run's pick]"
    console.rule(Text(strip_control(head)))
    fixed = ", ".join(f"{a}={p}" for a, p in run.fixed_policies.items()) or "cell defaults"
    console.print(Text(f"{run.axis} on {run.cell}; other axes: {fixed}; proposed by "
                       f"{strip_control(result.get('model') or ('(seed)' if not result.get('parent_id') else '?'))}"))
    console.print(Syntax(strip_control(diff), "diff", word_wrap=True) if diff else Text("(identical to the seed)"))
    t = Table(title="metrics", show_header=False)
    lo, hi = (list(result.get("fitness_ci") or []) + [None, None])[:2]
    t.add_row("fitness (in-sample draws " + ", ".join(map(str, result.get("draws") or [])) + ")",
              _ci(result.get("fitness"), lo, hi))
    if result.get("per_draw"):
        t.add_row("per draw", ", ".join(f"{d}: {v:.4f}" for d, v in result["per_draw"].items()))
    h = result.get("heldout")
    if h:
        t.add_row(f"held-out (draws {', '.join(map(str, h['draws']))}, {h['level']:.1%})",
                  _ci(h["fitness"], *h["fitness_ci"]) + ("  significant" if h["significant"] else "  not significant"))
    for k, v in sorted((result.get("metrics") or {}).items()):
        t.add_row(k, _f(v, "{:,.4g}") if isinstance(v, (int, float)) else Text(strip_control(v)))
    console.print(t)
    chain = R.lineage(run, cid)
    console.print(Text("lineage: " + " <- ".join(
        f"{r['candidate_id']} (it {r.get('iteration', '?')}, fit {_f(r.get('fitness'))})"
        if r.get("status") != "missing" else f"{r['candidate_id']} (missing)" for r in chain)
        + ("  (seed)" if chain and chain[-1].get("parent_id") is None and chain[-1].get("status") != "missing"
           else "")))
    if rec is not None:
        console.print(Text(f"LLM: {strip_control(rec.model)}, {rec.seconds:.1f} s, {rec.attempts} attempt(s)"
                           + (f", usage {rec.usage}" if rec.usage else "")))
        if not args.no_prompt:
            console.print(Panel(Text(strip_control(rec.prompt.get("system", ""))), title="system prompt"))
            console.print(Panel(Text(strip_control(rec.prompt.get("user", ""))), title="prompt"))
        console.print(Panel(Text(strip_control(rec.response or rec.error or "")),
                            title="response" if rec.response is not None else "error"))
    elif result.get("iteration"):
        console.print(Text("(no LLM journal record for this iteration)"))
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
        console.print(Text(f"wrote {p}"))
    return 0


def _out_dir(value: str | None, default: Any) -> Any:
    from pathlib import Path
    return Path(value) if value else default


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_run
    run = R.resolve_run(R.runs_root(args.runs_dir), args.run)
    pkg = export_run(run, args.candidate, args.to, _out_dir(args.out, None), name=args.name, force=args.force,
                     force_inadmissible=args.force_inadmissible)
    console.print(Text(f"exported {run.run_id}/{pkg.candidate_id} ({run.axis}) to {pkg.out} as package "
                       f"'{pkg.package}'; see {pkg.out / 'README.md'}"))
    for line in pkg.summary():
        console.print(Text(line))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", metavar="DIR", help=f"runs root (default ${R.ENV_RUNS} or ./runs)")


def register(sub: Any) -> None:
    p = sub.add_parser("runs", help="list search runs: LLM, best in-sample and held-out, failures")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("leaderboard", help="a run's candidates, best first (held-out checked first)")
    p.add_argument("run", nargs="?", help="run id or directory (default: the latest run)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true")
    _common(p)
    p.set_defaults(func=cmd_leaderboard)
    p = sub.add_parser("show", help="one candidate (default: the run's pick): diff, fitness, lineage, "
                                    "the LLM's prompt and answer")
    p.add_argument("run")
    p.add_argument("candidate", nargs="?", help="candidate id (default: the run's pick)")
    p.add_argument("--no-prompt", action="store_true", help="leave out the prompt (keep the answer)")
    p.add_argument("--json", action="store_true")
    _common(p)
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("plot", help="PNGs: fitness per island with its interval, JCT CDF and KV utilisation "
                                    "of the pick vs the seed")
    p.add_argument("run")
    p.add_argument("--candidate", help="plot this candidate instead of the run's pick")
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
