"""The simulator's commands: `evolve cells | policies | simulate | sweep`.

    evolve cells | policies                             what exists
    evolve simulate --cell C [--retention P] ...        one policy combination
    evolve sweep --cell C --retention a,b --scheduling x,y   the paper's Table 1 form

The console script (search/cli.py) mounts them with `register(subparsers, load_policy_file)`.
A policy *file* given to `simulate` is candidate code: it is loaded by `load_policy_file`,
which the console script takes from the sandbox; this layer imports nothing above it, and
runs a file in this process only under --trusted.
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable

from rich.table import Table

from .argtypes import positive_int
from .config import cell_catalog, get_cell
from .display import print_table, stdout_console
from .policies.base import PolicyError
from .policies.registry import AXES, policy_names
from .sim import simulate
from .workload import load_programs

# (path, axis, allow_weak_sandbox) -> a policy object whose code runs in a sandboxed worker
PolicyFileLoader = Callable[[str, str, bool], Any]

console = stdout_console()


def _cmd_cells(args: argparse.Namespace) -> int:
    cells = cell_catalog()
    if args.json:
        print(json.dumps({n: {"hardware": c.hardware.key, "model": c.model.key, "tp": c.tp,
                              "instances": c.instances, "kv_pool_tokens": c.kv_pool_tokens,
                              "workload": c.workload.model_dump(exclude_none=True), "rate_jps": c.rate_jps}
                          for n, c in sorted(cells.items())}))
        return 0
    rows = [[n, c.hardware.key, c.model.key, str(c.tp), str(c.instances), f"{c.kv_pool_tokens:,}",
             f"{c.workload.kind} x{c.workload.programs}" if c.workload.programs else c.workload.kind,
             f"{c.rate_jps:g}"] for n, c in sorted(cells.items())]
    print_table(console, "cells", ["cell", "hardware", "model", "TP", "inst", "KV pool (tok)", "workload",
                                   "rate (JPS)"], rows, ids=("cell",), right=("TP", "inst", "KV pool (tok)",
                                                                              "rate (JPS)"))
    return 0


def _cmd_policies(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps({axis: policy_names(axis) for axis in AXES}))
        return 0
    print_table(console, "shipped policies", ["axis", "policies"],
                [[axis, ", ".join(policy_names(axis))] for axis in AXES], ids=("axis",))
    return 0


def _summary_table(title: str, s: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("programs / calls", f"{s['programs']} / {s['calls']}"),
            ("mean JCT", f"{s['mean_jct_s']:.1f} s"), ("p50 / p99 JCT", f"{s['p50_jct_s']:.1f} / {s['p99_jct_s']:.1f} s"),
            ("makespan", f"{s['makespan_s']:.1f} s"), ("mean queueing / call", f"{s['mean_queueing_s']:.2f} s"),
            ("mean TTFT / TPOT", f"{s['mean_ttft_s'] * 1e3:.1f} / {s['mean_tpot_s'] * 1e3:.2f} ms"),
            ("preemptions", str(s["preemptions"])), ("prefix hit rate", f"{s['prefix_hit_rate']:.1%}"),
            ("throughput", f"{s['throughput_tok_s']:.1f} tok/s"), ("mean KV utilisation", f"{s['mean_kv_utilization']:.1%}"),
            ("energy", f"{s['energy_kj']:.0f} kJ"), ("engine steps / events", f"{s['engine_steps']} / {s['events']}"),
            ("wall", f"{s['wall_s']:.2f} s")]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _load_policy_arg(axis: str, spec: str | None, trusted: bool, allow_weak_sandbox: bool,
                     load_policy_file: PolicyFileLoader) -> Any:
    """Shipped names pass through; files go to `load_policy_file` (the sandbox) unless --trusted."""
    if spec is None or spec in policy_names(axis) or trusted:
        return spec
    from pathlib import Path
    if not Path(spec).is_file():
        raise PolicyError(f"--{axis} {spec}: unknown {axis} policy; shipped: {', '.join(policy_names(axis))} "
                          "(or a path to a policy .py file)")
    try:
        return load_policy_file(spec, axis, allow_weak_sandbox)
    except PolicyError as e:  # name the flag and file, so the line stands alone
        msg = str(e)
        raise PolicyError(f"--{axis} {msg}" if msg.startswith(spec) else f"--{axis} {spec}: {msg}") from None


def _cmd_simulate(args: argparse.Namespace) -> int:
    cell = get_cell(args.cell)
    programs = load_programs(args.workload) if args.workload else None
    pols = {axis: _load_policy_arg(axis, getattr(args, axis), args.trusted, args.allow_weak_sandbox,
                                   args.load_policy_file) for axis in AXES}
    files = [getattr(args, a) for a in AXES if getattr(args, a) and getattr(args, a) not in policy_names(a)]
    try:
        res = simulate(cell, programs=programs, seed=args.seed, arrivals=args.arrivals, **pols)
    except PolicyError as e:  # name the file whose policy failed, so the error stands alone
        raise PolicyError(f"{', '.join(files)}: {e}" if files else str(e)) from None
    if args.out:
        res.write(args.out)
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        pol = res.policies
        console.print(_summary_table(f"{cell.name}: retention={pol['retention']} scheduling={pol['scheduling']}"
                                     f" routing={pol['routing']} seed={res.seed}", res.summary))
        if args.out:
            console.print(f"results written to {args.out}")
    return 0


def _sweep_point(job: tuple[str, str, str, int | None, str | None]) -> dict[str, Any]:
    cell, ret, sch, seed, wl = job
    programs = load_programs(wl) if wl else None
    return simulate(cell, programs=programs, retention=ret, scheduling=sch, seed=seed).to_json()


def _cmd_sweep(args: argparse.Namespace) -> int:
    cell = get_cell(args.cell)
    rets = [x for x in args.retention.split(",") if x]
    schs = [x for x in args.scheduling.split(",") if x]
    for axis, names in (("retention", rets), ("scheduling", schs)):
        for n in names:
            if n not in policy_names(axis):
                raise PolicyError(f"unknown {axis} policy '{n}'; shipped: {', '.join(policy_names(axis))}")
    points = [(r, s) for r in rets for s in schs]
    base = ("cache-lru", "fcfs")
    jobs = [(cell.name, r, s, args.seed, args.workload) for r, s in ([base] + [p for p in points if p != base])]
    if args.jobs > 1:
        import multiprocessing as mp
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            results = list(ex.map(_sweep_point, jobs))
    else:
        results = [_sweep_point(j) for j in jobs]
    by = {(j[1], j[2]): r for j, r in zip(jobs, results)}
    b = by[base]["mean_jct_s"]
    table = {f"{r}+{s}": {"mean_jct_s": by[(r, s)]["mean_jct_s"],
                          "delta_vs_lru_fcfs": by[(r, s)]["mean_jct_s"] / b - 1.0} for r, s in points}
    if args.json:
        print(json.dumps({"cell": cell.name, "baseline": "cache-lru+fcfs", "baseline_mean_jct_s": b,
                          "points": table, "details": {f"{r}+{s}": v for (r, s), v in by.items()}}))
        return 0
    t = Table(title=f"{cell.name}: change in mean JCT vs cache-lru + fcfs ({b:,.0f} s); lower is better")
    t.add_column("retention \\ scheduling")
    for s in schs:
        t.add_column(s, justify="right")
    for r in rets:
        t.add_row(r, *[f"{table[f'{r}+{s}']['delta_vs_lru_fcfs']:+.1%}" for s in schs])
    console.print(t)
    return 0


def register(sub: Any, load_policy_file: PolicyFileLoader) -> None:
    """Add cells, policies, simulate and sweep to the console script's subparsers."""
    c = sub.add_parser("cells", help="list cells")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_cells)
    c = sub.add_parser("policies", help="list shipped policies")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_policies)
    c = sub.add_parser("simulate", help="simulate one policy combination on a cell")
    c.add_argument("--cell", required=True)
    for axis in AXES:
        c.add_argument(f"--{axis}", metavar="P", help=f"{axis} policy: shipped name or policy file")
    c.add_argument("--seed", type=int)
    c.add_argument("--workload", metavar="FILE", help="JSONL workload instead of the cell's")
    c.add_argument("--arrivals", choices=["poisson", "recorded"],
                   help="Poisson at the cell's rate, or the trace's recorded times (meta.arrival_s)")
    c.add_argument("--trusted", action="store_true", help="run policy files in-process (no sandbox)")
    c.add_argument("--allow-weak-sandbox", action="store_true",
                   help="run policy files even where a sandbox isolation layer is unavailable on this machine")
    c.add_argument("--out", metavar="DIR", help="write summary.json, programs.csv, calls.csv, kv_timeline.csv")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_simulate, load_policy_file=load_policy_file)
    c = sub.add_parser("sweep", help="sweep retention x scheduling (paper Table 1)")
    c.add_argument("--cell", required=True)
    c.add_argument("--retention", default="cache-lru,ttl,pressure-ttl")
    c.add_argument("--scheduling", default="fcfs,plas")
    c.add_argument("--seed", type=int)
    c.add_argument("--workload", metavar="FILE")
    c.add_argument("--jobs", type=positive_int, default=1, help="parallel simulations (processes)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_sweep)
