"""`evolve replay`: program-causal replay of a workload against a running server.

Every program is one asyncio task: it waits for its arrival a_p, sends call 0, and sends
call k+1 only when call k's response has completed (the stream closed) and call k's
recorded tool gap has passed: r_{p,k+1} = c_{p,k} + g_{p,k}, the simulator's Eq. 2, so
the release schedule is the one the server's own speed and policy induce. Prompts are
token ids with the workload's shared prefixes (prompts.py), `max_tokens` is the recorded
output length with EOS ignored, and every token is timed as it streams in.

The result is a `simcore.metrics.SimResult`, written by the simulator's own writer
(summary.json, programs.csv, calls.csv, kv_timeline.csv), plus server_metrics.json with
the server's Prometheus counters over the run. Ctrl-C (or a failing call) stops the
replay and keeps every call and program that finished.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from simcore.metrics import CALL_COLUMNS, PROGRAM_COLUMNS, SimResult, add_call_latencies, frame_summary
from simcore.workload import Program

from .client import LiveError, ServerClient, ServerInfo, metric_value
from .exported import ExportedPolicy
from .prompts import PromptBuilder

# Prometheus counters read before and after the run (vLLM v1 names); deltas go to the summary.
COUNTERS = ("vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
            "vllm:prompt_tokens_cached_total",
            "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
            "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
            "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
            "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count",
            "vllm:request_num_preemptions_sum")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


@dataclass
class CallRecord:
    program_id: str
    turn: int
    release_s: float
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hit_tokens: float
    queue_s: float
    release_lag_s: float
    server_ttft_s: float = math.nan     # engine: scheduled -> first token (vLLM per-request metrics)
    server_decode_s: float = math.nan   # engine: first -> last token


@dataclass
class ReplayOutcome:
    result: SimResult
    server_metrics: dict[str, Any]
    interrupted: bool = False
    error: str | None = None
    info: ServerInfo | None = None
    records: list[CallRecord] = field(default_factory=list)

    def write(self, out: str | Path) -> Path:
        d = self.result.write(out)
        tmp = d / ".server_metrics.json.tmp"
        tmp.write_text(json.dumps(self.server_metrics, indent=2, default=_json_default))
        os.replace(tmp, d / "server_metrics.json")
        return d


def _json_default(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return x


def check_fits(programs: Sequence[Program], info: ServerInfo) -> None:
    """Every call's prompt + output must fit the server's max model length."""
    if not info.max_model_len:
        return
    for p in programs:
        for k, c in enumerate(p.calls):
            need = c.prompt_tokens + c.output_tokens
            if need > info.max_model_len:
                raise LiveError(f"program '{p.program_id}' call {k} needs {c.prompt_tokens} prompt + {c.output_tokens} "
                                f"output tokens = {need}, more than the server's max model length "
                                f"{info.max_model_len} ({info.model})")


class Replay:
    """One replay of `programs` arriving at `arrivals` (seconds from the start)."""

    def __init__(self, client: ServerClient, programs: Sequence[Program], arrivals: Sequence[float], *,
                 seed: int = 0, token_range: tuple[int, int] = (100, 1000), policy: ExportedPolicy | None = None,
                 poll_s: float = 0.25, on_call: Callable[[int, int], None] | None = None,
                 prompt_salt: int | None = None) -> None:
        if len(arrivals) != len(programs):
            raise LiveError(f"{len(arrivals)} arrival times for {len(programs)} programs")
        self.client = client
        self.programs = list(programs)
        self.arrivals = [float(a) for a in arrivals]
        self.seed = seed
        # a fresh salt per replay: the server's prefix cache must not still hold the last replay's prompts
        self.salt = secrets.randbits(31) if prompt_salt is None else int(prompt_salt)
        self.token_range = token_range
        self.policy = policy
        self.poll_s = poll_s
        self.on_call = on_call
        self.records: list[CallRecord] = []
        self.finished: dict[int, float] = {}     # program index -> completion of its last call
        self.timeline: list[tuple[float, float, float, float]] = []
        self.error: str | None = None
        self.stop = asyncio.Event()
        self.t0 = 0.0

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def _sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            await asyncio.sleep(dt)

    async def _program(self, i: int) -> None:
        prog = self.programs[i]
        builder = PromptBuilder(prog, i, self.seed, self.token_range, self.salt)
        due = self.arrivals[i]
        mine: list[CallRecord] = []
        try:
            for k, call in enumerate(prog.calls):
                await self._sleep_until(due)
                prompt = builder.prompt(k)
                release = self.now()
                handle, body, headers = None, None, None
                if self.policy is not None:
                    handle, body, headers = self.policy.begin(prog.program_id, len(prompt), release)
                res = await self.client.stream_completion(prompt, call.output_tokens, body, headers)
                sent = res.sent_s - self.t0
                q = res.queue_s if res.queue_s is not None else math.nan
                rec = CallRecord(prog.program_id, k, sent, sent + q, res.first_token_s - self.t0,
                                 res.last_token_s - self.t0, res.end_s - self.t0, len(prompt), len(res.output_ids),
                                 float(res.cached_tokens) if res.cached_tokens is not None else math.nan, q,
                                 max(0.0, release - due),
                                 res.server_ttft_s if res.server_ttft_s is not None else math.nan,
                                 res.server_decode_s if res.server_decode_s is not None else math.nan)
                mine.append(rec)
                self.records.append(rec)
                if self.policy is not None:   # completion = the last token, the simulator's c_{p,k}
                    self.policy.end(handle, len(prompt), len(res.output_ids), call.tool_name, rec.finish_s,
                                    None if math.isnan(rec.first_scheduled_s) else rec.first_scheduled_s)
                builder.generated(prompt, res.output_ids)
                # Eq. 2: the successor is due when this response has completed plus the tool gap.
                due = rec.end_s + call.tool_duration_s
                if self.on_call:
                    self.on_call(i, k)
            self.finished[i] = mine[-1].finish_s
            if self.policy is not None:
                self.policy.finish(prog.program_id)
        except LiveError as e:
            if self.error is None:
                self.error = f"program '{prog.program_id}': {e}"
            self.stop.set()

    async def _poll(self) -> None:
        if self.poll_s <= 0:
            return
        while not self.stop.is_set():
            g = await self.client.gauges(GAUGES)
            if g is None:
                return
            vals = [g[name] for name in GAUGES]
            if vals[2] is not None:
                self.timeline.append((self.now(), vals[2], vals[0] or 0.0, vals[1] or 0.0))
            try:
                await asyncio.wait_for(self.stop.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def run(self) -> ReplayOutcome:
        info = self.client.info
        before = await self.client.metrics()
        loop = asyncio.get_running_loop()
        interrupted = False

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            self.stop.set()

        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
            handler = True
        except (NotImplementedError, RuntimeError, ValueError):   # not the main thread
            handler = False
        wall0 = time.perf_counter()
        self.t0 = loop.time()
        tasks = [asyncio.create_task(self._program(i)) for i in range(len(self.programs))]
        poller = asyncio.create_task(self._poll())
        all_done = asyncio.gather(*tasks, return_exceptions=True)
        stopper = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait([all_done, stopper], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            interrupted = True
        finally:
            for tk in tasks:
                tk.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.stop.set()
            await asyncio.gather(poller, stopper, all_done, return_exceptions=True)
            if handler:
                loop.remove_signal_handler(signal.SIGINT)
        wall = time.perf_counter() - wall0
        after = await self.client.metrics()
        for tk in tasks:   # a bug (not a LiveError) in a program task must not pass silently
            if tk.done() and not tk.cancelled() and tk.exception() is not None:
                raise tk.exception()  # type: ignore[misc]
        return self._outcome(info, before, after, wall, interrupted)

    # ------------------------------------------------------------------ results
    def _outcome(self, info: ServerInfo | None, before: Any, after: Any, wall: float,
                 interrupted: bool) -> ReplayOutcome:
        done = sorted(self.finished)
        ids = {self.programs[i].program_id for i in done}
        recs = sorted(self.records, key=lambda r: (r.program_id, r.turn))
        calls = pd.DataFrame({
            "program_id": [r.program_id for r in recs],
            "turn": [r.turn for r in recs],
            "instance": [0] * len(recs),
            "release_s": [r.release_s for r in recs],
            "first_scheduled_s": [r.first_scheduled_s for r in recs],
            "first_token_s": [r.first_token_s for r in recs],
            "finish_s": [r.finish_s for r in recs],
            "prompt_tokens": [r.prompt_tokens for r in recs],
            "output_tokens": [r.output_tokens for r in recs],
            "prefix_hit_tokens": [r.prefix_hit_tokens for r in recs],
            "host_hit_tokens": [0] * len(recs),
            "preemptions": [math.nan] * len(recs),   # the API does not say which request was preempted
        }, columns=CALL_COLUMNS)
        calls = add_call_latencies(calls)
        calls["response_end_s"] = [r.end_s for r in recs]
        calls["release_lag_s"] = [r.release_lag_s for r in recs]
        # The engine's own clock (vLLM --enable-per-request-metrics): what of each call's time the
        # engine spent, and what the path client -> engine -> client added (api_overhead_s: client
        # TTFT - queue - engine TTFT, i.e. HTTP, input processing, IPC and streaming, in and out).
        calls["server_ttft_s"] = [r.server_ttft_s for r in recs]
        calls["server_decode_s"] = [r.server_decode_s for r in recs]
        calls["api_overhead_s"] = [r.first_token_s - r.release_s - r.queue_s - r.server_ttft_s for r in recs]
        by_prog: dict[str, list[CallRecord]] = {}
        for r in recs:
            by_prog.setdefault(r.program_id, []).append(r)
        rows = []
        for i in done:
            p = self.programs[i]
            rs = by_prog[p.program_id]
            service = sum(r.finish_s - (r.first_scheduled_s if math.isfinite(r.first_scheduled_s) else r.release_s)
                          for r in rs)
            rows.append({"program_id": p.program_id, "arrival_s": self.arrivals[i], "finish_s": self.finished[i],
                         "jct_s": self.finished[i] - self.arrivals[i], "calls": len(p.calls),
                         "preemptions": math.nan, "attained_service_s": service})
        programs = pd.DataFrame(rows, columns=PROGRAM_COLUMNS)
        summary = frame_summary(programs, calls) if len(programs) else {"programs": 0, "calls": len(calls)}
        server = self._server_metrics(before, after, info)
        deltas = server.get("delta", {})
        summary["preemptions"] = int(deltas["vllm:num_preemptions_total"]) \
            if deltas.get("vllm:num_preemptions_total") is not None else None
        if calls["prefix_hit_tokens"].notna().all() and len(calls):
            summary["prefix_hit_rate"] = float(calls["prefix_hit_tokens"].sum()) / max(1, int(calls["prompt_tokens"].sum()))
            summary["prefix_hit_source"] = "usage.prompt_tokens_details.cached_tokens"
        elif deltas.get("vllm:prefix_cache_hits_total") is not None and len(calls):
            summary["prefix_hit_rate"] = deltas["vllm:prefix_cache_hits_total"] / max(1, int(calls["prompt_tokens"].sum()))
            summary["prefix_hit_source"] = "vllm:prefix_cache_hits_total / prompt tokens sent"
        else:
            summary["prefix_hit_rate"] = None
            summary["prefix_hit_source"] = None
        summary["prefill_tokens_computed"] = deltas.get("prefill_tokens_computed")
        if calls["queueing_s"].isna().all():
            summary["mean_queueing_s"] = None   # the server reports no per-request queue time
        tl = pd.DataFrame(self.timeline, columns=["t_s", "kv_utilization", "running", "waiting"])
        summary.update({
            "mean_kv_utilization": float(tl["kv_utilization"].mean()) if len(tl) else None,
            "max_waiting": float(tl["waiting"].max()) if len(tl) else None,
            "busy_s": None, "energy_kj": None, "engine_steps": None, "events": None, "wall_s": wall,
            "server": info.url if info else self.client.url, "model": info.model if info else self.client.model,
            "server_version": info.version if info else None,
            "programs_total": len(self.programs), "interrupted": bool(interrupted), "error": self.error,
            "programs_unfinished": [p.program_id for p in self.programs if p.program_id not in ids][:20],
            "client_release_lag_p99_s": float(calls["release_lag_s"].quantile(0.99)) if len(calls) else None,
            "policy": self.policy.describe() if self.policy else None,
            "prompt_salt": self.salt,
            "clock_origin_monotonic_s": self.t0,   # time 0 of the times above on the host's CLOCK_MONOTONIC
        })
        pol = {"retention": "server", "scheduling": "server", "routing": "server"}
        if self.policy is not None:
            pol[self.policy.axis] = f"export:{self.policy.package}"
        res = SimResult(cell="replay", policies=pol, seed=self.seed, programs=programs, calls=calls,
                        kv_timeline=[tl[["t_s", "kv_utilization"]]], summary=_clean(summary))
        return ReplayOutcome(res, server, interrupted, self.error, info, recs)

    def _server_metrics(self, before: Any, after: Any, info: ServerInfo | None) -> dict[str, Any]:
        if before is None or after is None:
            return {"available": False}
        model = self.client.model
        out: dict[str, Any] = {"available": True, "before": {}, "after": {}, "delta": {}, "max": {}}
        for name in COUNTERS:
            b, a = metric_value(before, name, model), metric_value(after, name, model)
            out["before"][name], out["after"][name] = b, a
            out["delta"][name] = (a - b) if a is not None and b is not None else None
        column = {"vllm:num_requests_running": 2, "vllm:num_requests_waiting": 3, "vllm:kv_cache_usage_perc": 1}
        for name, j in column.items():
            vals = [row[j] for row in self.timeline]
            out["max"][name] = max(vals) if vals else None
        b, a = (metric_value(x, "vllm:prompt_tokens_by_source_total", model, source="local_compute")
                for x in (before, after))
        out["delta"]["prefill_tokens_computed"] = (a - b) if a is not None and b is not None else None
        d = out["delta"]
        q, h = d.get("vllm:prefix_cache_queries_total"), d.get("vllm:prefix_cache_hits_total")
        out["prefix_cache_hit_rate"] = (h / q) if q else None
        qs, qc = d.get("vllm:request_queue_time_seconds_sum"), d.get("vllm:request_queue_time_seconds_count")
        out["mean_queue_time_s"] = (qs / qc) if qc else None
        if info is not None:
            out["block_size"], out["kv_pool_tokens"] = info.block_size, info.kv_pool_tokens
        return out


async def replay(client: ServerClient, programs: Sequence[Program], arrivals: Sequence[float], **kw: Any) -> ReplayOutcome:
    """Probe the server, check the workload fits it, then run the replay."""
    info = client.info or await client.check(kw.get("token_range", (100, 1000)))
    check_fits(programs, info)
    return await Replay(client, programs, arrivals, **kw).run()
