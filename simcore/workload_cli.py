"""`evolve workload ...`: import public traces, generate calibrated workloads, print stats.

    evolve workload import --format F SRC -o OUT.jsonl [--arrivals recorded|poisson] [--rate R] [--seed S]
    evolve workload generate --kind swe|swe-tracelab|bfcl -n N --seed S -o OUT.jsonl
    evolve workload stats FILE [--json]

Bad input (unknown format or kind, malformed or truncated source, unwritable output) is
one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from simcore.generators import KNOWN_KINDS, generate
from simcore.importers import ARRIVAL_MODES, import_trace, known_formats
from simcore.workload import Program, WorkloadError, load_programs, save_programs

LONG_TOOL_S = 60.0  # "calls longer than one minute" (paper §1, TraceLab)


def workload_stats(programs: list[Program]) -> dict[str, Any]:
    """Summary figures of a workload, in the terms the calibration targets use."""
    n_calls = np.array([len(p.calls) for p in programs])
    prompts = np.array([c.prompt_tokens for p in programs for c in p.calls], dtype=float)
    outputs = np.array([c.output_tokens for p in programs for c in p.calls], dtype=float)
    tools = np.array([c.tool_duration_s for p in programs for c in p.calls[:-1]], dtype=float)
    by_tool: dict[str, list[float]] = {}
    for p in programs:
        for c in p.calls[:-1]:
            by_tool.setdefault(c.tool_name or "-", []).append(c.tool_duration_s)
    tool_total = float(tools.sum())
    long = tools > LONG_TOOL_S
    arrivals = [p.meta["arrival_s"] for p in programs if isinstance(p.meta.get("arrival_s"), (int, float))]

    def q(a: np.ndarray, pct: float) -> float | None:
        return float(np.percentile(a, pct)) if a.size else None

    out: dict[str, Any] = {
        "programs": len(programs),
        "calls": int(n_calls.sum()),
        "calls_per_program": {"mean": float(n_calls.mean()), "median": float(np.median(n_calls)),
                              "max": int(n_calls.max())},
        "context_tokens": int(prompts.sum()),
        "context_tokens_per_call": {"mean": float(prompts.mean()), "median": float(np.median(prompts)),
                                    "max": int(prompts.max())},
        "output_tokens": int(outputs.sum()),
        "output_tokens_per_call": {"mean": float(outputs.mean()), "median": float(np.median(outputs)),
                                   "max": int(outputs.max())},
        "tool_calls": int(tools.size),
        "tool_s": {"mean": float(tools.mean()) if tools.size else None, "median": q(tools, 50),
                   "p90": q(tools, 90), "p99": q(tools, 99), "total": tool_total},
        "tool_share_under_1s": float((tools < 1.0).mean()) if tools.size else None,
        "tool_calls_over_60s": float(long.mean()) if tools.size else None,
        "tool_time_share_over_60s": float(tools[long].sum() / tool_total) if tool_total > 0 else None,
        "tools": {name: {"calls": len(v), "median_s": float(np.median(v))} for name, v in sorted(by_tool.items())},
        "arrival_span_s": (max(arrivals) - min(arrivals)) if len(arrivals) == len(programs) else None,
    }
    return out


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `workload` with its sub-commands to the `evolve` parser."""
    wp = subparsers.add_parser("workload", help="import traces, generate workloads, workload statistics",
                               description="Import public agent traces, generate calibrated workloads, "
                                           "print workload statistics.")
    sub = wp.add_subparsers(dest="workload_cmd", metavar="{import,generate,stats}")
    sub.required = True

    ip = sub.add_parser("import", help="convert a public trace to the JSONL program format")
    ip.add_argument("src", help="source trace file")
    ip.add_argument("--format", "-f", required=True, dest="fmt",
                    help=f"source format: {', '.join(known_formats())}")
    ip.add_argument("-o", "--output", required=True, help="output JSONL workload")
    ip.add_argument("--arrivals", default=None, help=f"{' or '.join(ARRIVAL_MODES)} (default: recorded "
                    "where the source has arrival times, else none unless --rate is given)")
    ip.add_argument("--rate", type=float, default=None, help="Poisson arrival rate, programs per second")
    ip.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    ip.add_argument("--answers", default=None, help="bfcl: possible-answer file (default: found next to SRC)")
    ip.add_argument("--func-docs", default=None, help="bfcl: bfcl-eval multi_turn_func_doc folder, or 'none'")
    ip.add_argument("--ttft", type=float, default=None, help="lmcache: seconds to first token of the recorded model")
    ip.add_argument("--tpot", type=float, default=None, help="lmcache: seconds per output token of the recorded model")

    gp = sub.add_parser("generate", help="generate a calibrated synthetic workload")
    gp.add_argument("--kind", required=True, help=f"one of: {', '.join(KNOWN_KINDS)}")
    gp.add_argument("-n", type=int, required=True, help="number of programs")
    gp.add_argument("--seed", type=int, default=0)
    gp.add_argument("-o", "--output", required=True, help="output JSONL workload")

    sp = sub.add_parser("stats", help="statistics of a JSONL workload")
    sp.add_argument("file")
    sp.add_argument("--json", action="store_true", help="print one JSON object")

    wp.set_defaults(func=run)
    return wp


def run(args: argparse.Namespace) -> int:
    """Handle `evolve workload ...`; 0 on success, 2 on bad input."""
    try:
        if args.workload_cmd == "import":
            opts = {k: v for k, v in (("answers", args.answers), ("func_docs", args.func_docs),
                                      ("ttft_s", args.ttft), ("tpot_s", args.tpot)) if v is not None}
            programs = import_trace(args.fmt, args.src, arrivals=args.arrivals, rate=args.rate,
                                    seed=args.seed, **opts)
            _save(programs, args.output)
            return 0
        if args.workload_cmd == "generate":
            programs = generate(args.kind, args.n, args.seed)
            _save(programs, args.output)
            return 0
        if args.workload_cmd == "stats":
            stats = workload_stats(load_programs(args.file))
            if args.json:
                print(json.dumps(stats))
            else:
                _print_stats(args.file, stats)
            return 0
    except WorkloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"error: unknown workload command {args.workload_cmd!r}", file=sys.stderr)
    return 2


def _save(programs: list[Program], output: str) -> None:
    out = Path(output)
    try:
        save_programs(programs, out)
    except OSError as e:
        raise WorkloadError(f"{out}: cannot write ({e.strerror or e})") from None
    from rich.console import Console
    n_calls = sum(len(p.calls) for p in programs)
    Console(stderr=True).print(f"wrote {len(programs)} programs, {n_calls} calls -> {out}")


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _print_stats(path: str, s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"workload {path}", show_header=True)
    t.add_column("figure")
    t.add_column("value", justify="right")
    cp, ct, ot, ts = s["calls_per_program"], s["context_tokens_per_call"], s["output_tokens_per_call"], s["tool_s"]
    rows = [
        ("programs", s["programs"]), ("calls", s["calls"]),
        ("calls/program mean | median | max", f"{_fmt(cp['mean'])} | {_fmt(cp['median'])} | {cp['max']}"),
        ("context tokens (sum of prompts)", f"{s['context_tokens']:,}"),
        ("prompt tokens/call mean | max", f"{_fmt(ct['mean'])} | {ct['max']:,}"),
        ("output tokens", f"{s['output_tokens']:,}"),
        ("output tokens/call mean | median", f"{_fmt(ot['mean'])} | {_fmt(ot['median'])}"),
        ("tool calls", s["tool_calls"]),
        ("tool s median | p90 | p99", f"{_fmt(ts['median'])} | {_fmt(ts['p90'])} | {_fmt(ts['p99'])}"),
        ("tool calls < 1 s", _fmt(s["tool_share_under_1s"])),
        ("tool calls > 60 s", _fmt(s["tool_calls_over_60s"])),
        ("share of tool time in calls > 60 s", _fmt(s["tool_time_share_over_60s"])),
        ("arrival span s", _fmt(s["arrival_span_s"])),
    ]
    top = sorted(s["tools"].items(), key=lambda kv: -kv[1]["calls"])[:6]
    if top:
        rows.append(("median s of the commonest tools",
                     ", ".join(f"{name} {_fmt(v['median_s'])}" for name, v in top)))
    for k, v in rows:
        t.add_row(k, str(v))
    Console().print(t)
