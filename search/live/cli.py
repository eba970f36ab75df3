"""`evolve replay | profile | validate`: the simulator against the user's running server.

    evolve replay WORKLOAD --server URL [--rate R | --arrivals recorded | --cell C] [--policy EXPORT_DIR] [--out DIR]
    evolve profile --server URL --out PROFILE_DIR [--max-num-seqs N] [--max-num-batched-tokens N] [--repeats R]
    evolve validate --cell C --server URL [--policy EXPORT_DIR] [--noise-floor] [--out DIR]

Bad input (unreachable server, a model it does not serve, a server without streaming or
token-id prompts, prompts longer than its max model length) raises a `UserError` (LiveError
and the simulator's own): the console script prints it as one line, exit code 2. Ctrl-C
during a replay keeps what finished (exit code 130).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from simcore.argtypes import positive_float, positive_int
from simcore.config import get_cell
from simcore.sim import cell_programs, recorded_arrivals, simulate
from simcore.workload import Program, load_programs, poisson_arrivals

from .client import LiveError, ServerClient
from .exported import ExportedPolicy
from .profile import Grid, Profiler, _parse_list, default_grid, idle_check, write_profile
from .replay import ReplayOutcome, replay
from .validate import client_view, compare, markdown, plots, with_api_latency, write_report

console = Console(stderr=True)
out_console = Console()


def _token_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI, got '{text}'") from None
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO < HI, got '{text}'")
    return lo, hi


def _server_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--server", required=True, metavar="URL", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    c.add_argument("--model", help="served model name (default: the only one served)")
    c.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="bearer token the server wants (vLLM --api-key; default $VLLM_API_KEY)")
    c.add_argument("--token-range", type=_token_range, default=(100, 1000), metavar="LO:HI",
                   help="prompt token ids are drawn from [LO, HI) (inside the model's vocabulary; default 100:1000)")
    c.add_argument("--timeout", type=positive_float, default=600.0, metavar="S", help="per-request read timeout")


def _stream_interval(text: str) -> int | str | None:
    if text == "whole":
        return "whole"
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'whole' or a number of tokens, got '{text}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected >= 0, got '{text}'")
    return v or None


def _metrics_interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got '{text}'") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got '{text}'")
    return v


def _interval_arg(c: argparse.ArgumentParser) -> None:
    c.add_argument("--metrics-interval", type=_metrics_interval, default=0.25, metavar="S",
                   help="poll the server's gauges (running, waiting, KV usage) every S seconds during the "
                        "replay (default 0.25; 0: only the counters before and after)")
    c.add_argument("--stream-interval", type=_stream_interval, default="whole", metavar="whole|N|0",
                   help="tokens per streamed chunk (vLLM's stream_interval): 'whole' (default) streams the first "
                        "token and then the rest in one chunk, so streaming does not load the server or the "
                        "client; N per N tokens; 0 leaves it to the server (other OpenAI-compatible servers)")


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser("replay", help="replay a workload against a running server, program by program",
                              description="Program-causal replay (call k+1 released when call k completed plus "
                                          "its tool gap) of a JSONL workload against an OpenAI-compatible server.")
    c.add_argument("workload", nargs="?", metavar="WORKLOAD", help="JSONL workload (or use --cell)")
    c.add_argument("--cell", help="take the workload, rate and seed from a cell")
    c.add_argument("--rate", type=positive_float, metavar="JPS", help="Poisson arrival rate, programs per second")
    c.add_argument("--arrivals", choices=["poisson", "recorded"], help="Poisson at --rate, or meta.arrival_s")
    c.add_argument("--seed", type=int, help="seed of arrivals and prompt ids (default: the cell's, else 0)")
    c.add_argument("--programs", type=positive_int, metavar="N", help="only the first N programs")
    c.add_argument("--policy", metavar="EXPORT_DIR", help="an `evolve export` package: its tracker sets priorities")
    c.add_argument("--out", metavar="DIR", help="summary.json, programs.csv, calls.csv, kv_timeline.csv, "
                                                 "server_metrics.json (default runs/replays/<time>)")
    c.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    _server_args(c)
    _interval_arg(c)
    c.set_defaults(func=cmd_replay)

    c = subparsers.add_parser("profile", help="profile a running server's step times into a measured profile",
                              description="Black-box profile: prefill time over (new tokens, context) and decode "
                                          "step time over (batch size, context), fitted and checked per point.")
    c.add_argument("--out", required=True, metavar="PROFILE_DIR")
    c.add_argument("--max-num-seqs", type=positive_int, default=32, help="the server's max_num_seqs (bounds the batch grid)")
    c.add_argument("--max-num-batched-tokens", type=positive_int, default=2048,
                   help="the server's max_num_batched_tokens (bounds the prefill grid)")
    c.add_argument("--prefill-tokens", help="comma list of new-token counts N")
    c.add_argument("--contexts", help="comma list of cached contexts C for prefill (multiples of the block size)")
    c.add_argument("--batch-sizes", help="comma list of decode batch sizes B")
    c.add_argument("--decode-contexts", help="comma list of decode contexts L")
    c.add_argument("--decode-tokens", type=positive_int, default=32, help="tokens each decode stream generates")
    c.add_argument("--idle-gaps", metavar="MS,...", help="idle gaps (ms) before the calls that measure the engine's "
                                                         "wake-up cost and the per-call API latency (default 0,5,20,50,200)")
    c.add_argument("--repeats", type=positive_int, default=3)
    c.add_argument("--tolerance", type=positive_float, default=0.10, help="largest acceptable |fit - measured| / measured")
    c.add_argument("--json", action="store_true", help="print the measured points, the fit and its errors as JSON")
    _server_args(c)
    c.add_argument("--stream-interval", type=_stream_interval, default="whole", metavar="whole|N|0",
                   help="how the replays will stream (see `evolve replay`): the API-latency calls stream the same way")
    c.set_defaults(func=cmd_profile)

    c = subparsers.add_parser("validate", help="replay and simulate a cell's workload: the sim-vs-real table",
                              description="Replay the cell's workload against the server, simulate it with the "
                                          "cell's (measured) performance model, and print the validation table.")
    c.add_argument("--cell", required=True)
    c.add_argument("--seed", type=int)
    c.add_argument("--policy", metavar="EXPORT_DIR", help="an `evolve export` package, on both sides")
    c.add_argument("--profile", metavar="PROFILE_DIR", help="simulate with this measured profile instead of the cell's")
    c.add_argument("--noise-floor", action="store_true", help="replay twice: how far two real runs lie apart")
    c.add_argument("--api-latency", default="auto", metavar="auto|none|S",
                   help="per-request client<->engine latency the simulation adds (HTTP, IPC, streaming): the "
                        "profile's measured value (auto), none, or seconds")
    c.add_argument("--out", metavar="DIR", help="default runs/validate/<cell>-<time>")
    c.add_argument("--json", action="store_true")
    c.add_argument("--quiet", action="store_true")
    _server_args(c)
    _interval_arg(c)
    c.set_defaults(func=cmd_validate)


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# ---------------------------------------------------------------------------- replay
def _workload(args: argparse.Namespace) -> tuple[list[Program], list[float], int, str]:
    cell = get_cell(args.cell) if args.cell else None
    seed = args.seed if args.seed is not None else (cell.seed if cell else 0)
    if args.workload:
        programs = load_programs(args.workload)
    elif cell is not None:
        programs = cell_programs(cell, seed)
    else:
        raise LiveError("replay needs a WORKLOAD file or --cell")
    if args.programs:
        programs = programs[: args.programs]
    mode = args.arrivals or (cell.workload.arrivals if cell else ("poisson" if args.rate else None))
    if mode == "recorded":
        arrivals = recorded_arrivals(programs)
    else:
        rate = args.rate or (cell.rate_jps if cell else None)
        if not rate:
            raise LiveError("give the arrival rate: --rate JPS, --arrivals recorded, or --cell C")
        arrivals = poisson_arrivals(len(programs), rate, seed)
    label = args.workload or f"cell {args.cell}"
    return programs, arrivals, seed, label


def _progress(quiet: bool, total: int) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("calls"),
                    TextColumn("{task.fields[programs]}"), TimeElapsedColumn(), console=console,
                    disable=quiet, transient=False)


async def run_replay(server: str, programs: Sequence[Program], arrivals: Sequence[float], *, model: str | None,
                     api_key: str | None, timeout: float, token_range: tuple[int, int], seed: int,
                     policy: ExportedPolicy | None, quiet: bool, label: str = "replay",
                     stream_interval: int | str | None = "whole", metrics_interval: float = 0.25) -> ReplayOutcome:
    total = sum(len(p.calls) for p in programs)
    async with ServerClient(server, model, api_key, timeout, stream_interval=stream_interval) as client:
        info = await client.check(token_range)
        if not quiet:
            console.print(f"server {info.url}: model {info.model}, max model length {info.max_model_len}, "
                          f"KV pool {info.kv_pool_tokens or '?'} tokens, block {info.block_size or '?'}"
                          + ("" if info.queue_metrics else "; no per-request queue times "
                             "(start vLLM with --enable-per-request-metrics)")
                          + ("" if info.cached_tokens else "; no per-request prefix hits "
                             "(--enable-prompt-tokens-details)"), highlight=False)
        if policy is not None:
            console.print(policy.describe(), highlight=False)
        with _progress(quiet, total) as bar:
            task = bar.add_task(label, total=total, programs=f"0/{len(programs)} programs")
            done: set[int] = set()

            def on_call(i: int, k: int) -> None:
                if k == len(programs[i].calls) - 1:
                    done.add(i)
                bar.update(task, advance=1, programs=f"{len(done)}/{len(programs)} programs")

            return await replay(client, programs, arrivals, seed=seed, token_range=token_range, policy=policy,
                                on_call=on_call, poll_s=metrics_interval)


def _replay_table(title: str, s: dict[str, Any]) -> Table:
    def g(key: str, scale: float = 1.0, fmt: str = "{:.2f}", unit: str = "") -> str:
        v = s.get(key)
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v * scale) + unit

    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in (("programs / calls", f"{s.get('programs')} / {s.get('calls')}"),
                 ("mean JCT", g("mean_jct_s", unit=" s")), ("p50 / p99 JCT", f"{g('p50_jct_s')} / {g('p99_jct_s')} s"),
                 ("makespan", g("makespan_s", unit=" s")), ("mean queueing / call", g("mean_queueing_s", 1e3, unit=" ms")),
                 ("mean TTFT / TPOT", f"{g('mean_ttft_s', 1e3)} / {g('mean_tpot_s', 1e3)} ms"),
                 ("preemptions (server)", g("preemptions", fmt="{:.0f}")),
                 ("prefix hit rate", g("prefix_hit_rate", 100, "{:.1f}", " %")),
                 ("throughput", g("throughput_tok_s", fmt="{:.1f}", unit=" tok/s")),
                 ("mean KV utilisation (server)", g("mean_kv_utilization", 100, "{:.1f}", " %")),
                 ("client release lag p99", g("client_release_lag_p99_s", 1e3, unit=" ms")),
                 ("wall", g("wall_s", unit=" s"))):
        t.add_row(k, v)
    return t


def cmd_replay(args: argparse.Namespace) -> int:
    programs, arrivals, seed, label = _workload(args)
    policy = ExportedPolicy(args.policy) if args.policy else None
    out = Path(args.out or Path("runs") / "replays" / _stamp())
    outcome = asyncio.run(run_replay(args.server, programs, arrivals, model=args.model, api_key=args.api_key,
                                     timeout=args.timeout, token_range=args.token_range, seed=seed, policy=policy,
                                     quiet=args.quiet or args.json, label=Path(label).name,
                                     stream_interval=args.stream_interval,
                                     metrics_interval=args.metrics_interval))
    outcome.write(out)
    s = outcome.result.summary
    if args.json:
        print(json.dumps(outcome.result.to_json()))
    else:
        out_console.print(_replay_table(f"replay of {label} against {s.get('server')}", s))
    return _finish(outcome, out)


def _finish(outcome: ReplayOutcome, out: Path) -> int:
    s = outcome.result.summary
    if outcome.interrupted:
        console.print(f"interrupted: kept {s.get('programs', 0)} finished programs and {s.get('calls', 0)} calls "
                      f"in {out}", highlight=False)
        return 130
    if outcome.error:
        console.print(f"[bold red]error:[/] {outcome.error} (the {s.get('calls', 0)} calls that finished are in {out})",
                      highlight=False, soft_wrap=True)
        return 2
    console.print(f"results written to {out}", highlight=False)
    return 0


# ---------------------------------------------------------------------------- profile
def cmd_profile(args: argparse.Namespace) -> int:
    return asyncio.run(_profile(args))


async def _profile(args: argparse.Namespace) -> int:
    async with ServerClient(args.server, args.model, args.api_key, args.timeout) as client:
        info = await client.check(args.token_range)
        warn = await idle_check(client)
        if warn:
            console.print(f"[yellow]warning:[/] {warn}", highlight=False)
        g = default_grid(info, args.max_num_batched_tokens, args.max_num_seqs, args.repeats, args.decode_tokens)
        grid = Grid(_parse_list(args.prefill_tokens, "prefill-tokens") or g.prefill_tokens,
                    _parse_list(args.contexts, "contexts") or g.contexts,
                    _parse_list(args.batch_sizes, "batch-sizes") or g.batch_sizes,
                    _parse_list(args.decode_contexts, "decode-contexts") or g.decode_contexts,
                    args.decode_tokens, max(1, args.repeats), fill_pool=args.decode_contexts is None,
                    idle_gaps=g.idle_gaps if args.idle_gaps is None else
                    [x / 1000.0 for x in (_parse_list(args.idle_gaps, "idle-gaps") or [])])
        console.print(f"profiling {info.model} at {info.url}: prefill N={grid.prefill_tokens} x C={grid.contexts}, "
                      f"decode B={grid.batch_sizes} x L={grid.decode_contexts}, {grid.repeats} repeats", highlight=False)
        prof = Profiler(client, grid, args.token_range, stream_interval=args.stream_interval)
        n_points = prof.n_samples()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task("profile", total=n_points)
            prof.on_point = lambda what: bar.update(task, advance=1, description=what)
            prefill, decode, idle, skipped = await prof.run()
    for s in skipped:
        console.print(f"[yellow]skipped:[/] {s}", highlight=False)
    engine = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
              "block_size": info.block_size}
    res = write_profile(Path(args.out), info, grid, prefill, decode, args.tolerance, engine, skipped, idle)
    if args.json:
        print(json.dumps({"prefill": json.loads(res["prefill"].to_json(orient="records")),
                          "decode": json.loads(res["decode"].to_json(orient="records")),
                          "idle": json.loads(res["idle"].to_json(orient="records")) if len(res["idle"]) else [],
                          "meta": res["meta"], "profile_dir": str(Path(args.out).resolve())}, default=str))
        return 0
    _print_profile(res, args.tolerance)
    meta = res["meta"]
    console.print(f"profile written to {args.out}. A cell on it (cells.yaml, with your own hardware.yaml/models.yaml "
                  f"under AGENTSERVESIM_CONFIGS):\n  profile: {Path(args.out).resolve()}\n"
                  f"  kv_pool_tokens: {meta['kv_pool_tokens']}\n  engine: {{block_size: {info.block_size}, "
                  f"max_num_seqs: {args.max_num_seqs}, max_num_batched_tokens: {args.max_num_batched_tokens}}}",
                  highlight=False)
    return 0


def _print_profile(res: dict[str, Any], tol: float) -> None:
    p, d, meta = res["prefill"], res["decode"], res["meta"]
    server = meta.get("prefill_timing") == "server"
    t = Table(title="prefill: a lone request's " + ("engine time to first token (server: scheduled -> first token)"
                                                     if server else "time to first token (client)"))
    for col in ("new tokens N", "context C", "measured ms", "min-max ms", "fit ms", "error"):
        t.add_column(col, justify="right")
    for r in p.itertuples():
        flag = "" if abs(r.error) <= tol else " !"
        t.add_row(str(int(r.new_tokens)), str(int(r.context_tokens)), f"{r.time_s * 1e3:.2f}",
                  f"{r.min_s * 1e3:.2f}-{r.max_s * 1e3:.2f}", f"{r.fit_s * 1e3:.2f}", f"{r.error * 100:+.1f} %{flag}")
    out_console.print(t)
    t = Table(title="decode: step time (inter-token latency with B sequences decoding)")
    for col in ("batch B", "context L", "measured ms", "min-max ms", "fit ms", "error"):
        t.add_column(col, justify="right")
    for r in d.itertuples():
        flag = "" if abs(r.error) <= tol else " !"
        t.add_row(str(int(r.batch_size)), f"{r.context_tokens:.0f}", f"{r.step_s * 1e3:.3f}",
                  f"{r.min_s * 1e3:.3f}-{r.max_s * 1e3:.3f}", f"{r.fit_s * 1e3:.3f}", f"{r.error * 100:+.1f} %{flag}")
    out_console.print(t)
    idle = res.get("idle")
    if idle is not None and len(idle):
        t = Table(title="a replay-shaped call after an idle gap: engine wake-up and per-call API latency")
        for col in ("idle gap ms", "engine idle ms", "engine TTFT ms", "wake-up ms", "API latency ms", "samples"):
            t.add_column(col, justify="right")
        for r in idle.itertuples():
            def ms(v: Any) -> str:
                return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.2f}"
            t.add_row(f"{r.gap_s * 1e3:g}", ms(r.engine_idle_s), ms(r.engine_ttft_s), ms(getattr(r, "wake_s", None)),
                      ms(r.api_latency_s), str(r.samples))
        out_console.print(t)
    if meta.get("api_latency_s"):
        out_console.print(f"API latency per call (client send -> stream closed, minus the engine's queued -> last "
                          f"token; median): {meta['api_latency_s'] * 1e3:.2f} ms; `evolve validate` adds it to every "
                          "call (--api-latency)", highlight=False)
    f = meta["fit"]
    a, b = f["a"], f["b"]
    out_console.print(f"fit: prefill = {a[0] * 1e3:.3f} ms + {a[1] * 1e6:.3f} us x N + {a[2] * 1e9:.4f} ns x N(C+N/2); "
                      f"decode step = {b[0] * 1e3:.3f} ms + {b[1] * 1e6:.3f} us x B + {b[2] * 1e9:.4f} ns x B L"
                      + (f"; wake-up after idle up to {meta['wake_s_max'] * 1e3:.2f} ms" if meta.get("wake_s_max") else ""),
                      highlight=False)
    n = len(p) + len(d)
    bad = int((p["error"].abs() > tol).sum() + (d["error"].abs() > tol).sum())
    if bad:
        out_console.print(f"[yellow]{bad} of {n} points lie beyond the stated tolerance of {tol:.0%}[/] (marked !; "
                          f"largest {meta['max_abs_error']:.1%}): a noisy server or a shape the model does not "
                          "capture; rerun with more --repeats on an idle server", highlight=False)
    else:
        out_console.print(f"the fitted model reproduces all {n} measured points within {meta['max_abs_error']:.1%} "
                          f"(stated tolerance {tol:.0%}; mean {meta['mean_abs_error']:.1%})", highlight=False)


# ---------------------------------------------------------------------------- validate
def cmd_validate(args: argparse.Namespace) -> int:
    cell = get_cell(args.cell)
    if args.profile:
        from simcore.perf_measured import read_meta, resolve
        folder = resolve(args.profile)
        read_meta(folder)
        cell = cell.model_copy(update={"profile": str(folder)})
    seed = cell.seed if args.seed is None else args.seed
    programs = cell_programs(cell, seed)
    arrivals = recorded_arrivals(programs) if cell.workload.arrivals == "recorded" else \
        poisson_arrivals(len(programs), cell.rate_jps, seed)
    policy = ExportedPolicy(args.policy) if args.policy else None
    pols: dict[str, Any] = {}
    if policy is not None:
        pols[policy.axis] = str(policy.folder / "policy.py")
    sched = pols.get("scheduling") or cell.policies.scheduling
    if policy is None and sched != "fcfs":
        raise LiveError(f"cell '{cell.name}' schedules with '{sched}', which needs priorities from the client: pass "
                        "--policy EXPORT_DIR (an `evolve export` of that policy), or use an fcfs cell")
    if not cell.profile:
        console.print(f"[yellow]warning:[/] cell '{cell.name}' names no measured profile: the simulation uses the "
                      f"{cell.hardware.key} x {cell.model.key} tables/roofline, not this server's speed "
                      "(make one with `evolve profile`)", highlight=False)
    if cell.policies.retention != "cache-lru" and (policy is None or policy.axis != "retention"):
        console.print(f"[yellow]warning:[/] the cell simulates '{cell.policies.retention}' retention; a stock server "
                      "keeps freed blocks by LRU (cache-lru)", highlight=False)
    out = Path(args.out or Path("runs") / "validate" / f"{cell.name}-{_stamp()}")
    latency = _api_latency(args.api_latency, cell)
    raw = simulate(cell, programs=with_api_latency(programs, latency) if latency else programs, arrivals=arrivals,
                   seed=seed, **pols)
    raw.write(out / "sim_engine")   # the engine's own clock
    sim = client_view(raw, latency)
    sim.write(out / "sim")
    runs: list[ReplayOutcome] = []
    for rep in range(2 if args.noise_floor else 1):
        if policy is not None and rep:
            policy = ExportedPolicy(args.policy)   # a fresh tracker: the second replay starts from nothing
        o = asyncio.run(run_replay(args.server, programs, arrivals, model=args.model, api_key=args.api_key,
                                   timeout=args.timeout, token_range=args.token_range, seed=seed, policy=policy,
                                   quiet=args.quiet or args.json, label=f"replay {rep + 1}",
                                   stream_interval=args.stream_interval,
                                   metrics_interval=args.metrics_interval))
        o.write(out / ("real" if rep == 0 else f"real{rep + 1}"))
        if o.interrupted or o.error:
            return _finish(o, out / ("real" if rep == 0 else f"real{rep + 1}"))
        runs.append(o)
    if runs[0].info is not None:
        _consistency(cell, runs[0].info)
    real, real2 = runs[0].result, runs[1].result if len(runs) > 1 else None
    pol_label = f"{sim.policies['retention']} + {sim.policies['scheduling']}"
    title = (f"{cell.name} ({len(programs)} programs at {cell.rate_jps:g} JPS, seed {seed}), {pol_label}, "
             f"server {runs[0].info.model if runs[0].info else ''}"
             + (f", API latency {latency * 1e3:.2f} ms per call" if latency else ""))
    c = compare(real, sim, real2)
    write_report(out, c, title, {"cell": cell.name, "seed": seed, "server": args.server,
                                 "policies": sim.policies, "profile": cell.profile, "api_latency_s": latency},
                 real2 is not None)
    plots(out, real, sim, real2, cell.name)
    if args.json:
        print(json.dumps({"title": title, **c.to_json()}))
    else:
        out_console.print(_validation_table(c, title, real2 is not None))
        console.print(f"tables, plots (jct_cdf.png, jct_per_program.png) and both sides' files in {out}",
                      highlight=False)
    return 0


def _api_latency(spec: str, cell: Any) -> float:
    if spec == "none":
        return 0.0
    if spec == "auto":
        if not cell.profile:
            return 0.0
        from simcore.perf_measured import read_meta
        lat = read_meta(cell.profile).get("api_latency_s") or 0.0
        return float(lat) if isinstance(lat, (int, float)) and lat > 0 else 0.0
    try:
        v = float(spec)
    except ValueError:
        raise LiveError(f"--api-latency: expected auto, none or seconds, got '{spec}'") from None
    if not (v >= 0 and math.isfinite(v)):
        raise LiveError(f"--api-latency: expected seconds >= 0, got '{spec}'")
    return v


def _consistency(cell: Any, info: Any) -> None:
    if info.block_size and info.block_size != cell.engine.block_size:
        console.print(f"[yellow]warning:[/] the server's KV block is {info.block_size} tokens, the cell's "
                      f"{cell.engine.block_size}", highlight=False)
    if info.kv_pool_tokens and info.kv_pool_tokens != cell.kv_pool_tokens:
        console.print(f"[yellow]warning:[/] the server's KV pool is {info.kv_pool_tokens} tokens, the cell's "
                      f"{cell.kv_pool_tokens}", highlight=False)


def _validation_table(c: Any, title: str, noise: bool) -> Table:
    t = Table(title=title)
    for col in ("metric", "real", "sim", "error"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    if noise:
        t.add_column("real, 2nd replay", justify="right")
        t.add_column("noise floor", justify="right")
    md = markdown(c, title, noise).splitlines()[4:]
    for line in md:
        cells = [x.strip() for x in line.strip("|").split("|")]
        t.add_row(*cells)
    return t
