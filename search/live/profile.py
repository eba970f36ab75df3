"""`evolve profile`: black-box step-time profile of a running server.

Controlled request shapes on an otherwise idle server, each measured `repeats` times
(the median is kept, min and max are written beside it):

  prefill (N new tokens over C cached)  (3 x repeats samples) the prefix of C tokens is sent first (max_tokens 1)
      so it is cached, then prefix + N fresh ids; the engine's time to first token of that
      lone request (vLLM --enable-per-request-metrics: scheduled -> first token; else the
      client's) is the prefill, and the server's reported cached tokens give the true C.
      The rest of the client's TTFT (HTTP, IPC, streaming) is the API latency per request.
  decode (B sequences of context L)     B streams with distinct L-token prompts start
      together; once the last one has its first token and until the first one finishes,
      every sequence decodes in every step, so the mean inter-token gap in that window is
      the step time (the median over repeats is kept), at the mean context of the gaps used.

The tables and the fitted model (simcore/perf_measured.py) go to PROFILE_DIR; the fit's
error at every measured point is printed and recorded, with the tolerance it was held to.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from simcore.perf_measured import PROFILE_FORMAT, fit, point_errors

from .client import LiveError, ServerClient, ServerInfo, metric_value


# A lone request's time to first token crosses the HTTP server and the engine, so on a busy
# host it scatters far more than a decode sample (itself a median over many token gaps):
# prefill points get this many samples per repeat.
PREFILL_PER_REPEAT = 3
# Idle gaps (s) before the wake-up / API-latency requests: back-to-back up to a tool call's length.
IDLE_GAPS = (0.0, 0.005, 0.02, 0.05, 0.2)
IDLE_PROMPT_TOKENS = 256     # a mid-sized agent call
IDLE_OUTPUT_TOKENS = 8       # a first chunk, a last chunk, usage, [DONE]: a replay call's stream


@dataclass
class Grid:
    prefill_tokens: list[int]
    contexts: list[int]
    batch_sizes: list[int]
    decode_contexts: list[int]
    decode_tokens: int = 32
    repeats: int = 3
    # For each batch size B, also decode at the longest context the KV pool holds B times: an
    # agent workload runs its batches near that bound, where the KV-read term dominates, and
    # a fixed context grid reaches it only for the smallest B.
    fill_pool: bool = True
    # Client-side idle gaps before the lone requests that measure the engine's wake-up cost and
    # the per-call API latency (seconds; empty: not measured).
    idle_gaps: list[float] = field(default_factory=lambda: list(IDLE_GAPS))


def default_grid(info: ServerInfo, max_num_batched_tokens: int, max_num_seqs: int, repeats: int,
                 decode_tokens: int = 32) -> Grid:
    """Grids bounded by what the server can hold: max model length, KV pool, step budget."""
    mml = info.max_model_len or 4096
    bs = info.block_size or 16
    pool = info.kv_pool_tokens or 1 << 30
    top = min(max_num_batched_tokens, mml - 2, pool - 2)
    n = [x for x in (16, 64, 256, 512, 1024, 2048, 4096, 8192) if x <= top]
    if n and top > 1.25 * n[-1]:
        n.append(top)   # the largest chunk one step can take
    c = sorted({0, *[x - x % bs for x in (mml // 8, mml // 4, mml // 2, 3 * mml // 4) if x - x % bs > 0]})
    ctx = sorted({x for x in (64, 256, 1024, 4096) if x + decode_tokens < mml} or {max(1, mml // 4)})
    b = [x for x in (1, 2, 4, 8, 16, 32, 64) if x <= max_num_seqs and x * (min(ctx) + decode_tokens + bs) <= pool]
    return Grid(n, [x for x in c if x + min(n) + 1 < min(mml, pool)], b, ctx, decode_tokens, repeats)


def _parse_list(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise LiveError(f"--{what}: expected comma-separated integers, got '{text}'") from None
    if not vals or vals[0] < 0:
        raise LiveError(f"--{what}: expected non-negative integers, got '{text}'")
    return vals


class Profiler:
    def __init__(self, client: ServerClient, grid: Grid, token_range: tuple[int, int] = (100, 1000),
                 on_point: Callable[[str], None] | None = None, stream_interval: int | str | None = "whole") -> None:
        """`stream_interval`: how the replay will stream its calls (the API-latency samples do the same)."""
        self.client, self.grid, self.token_range, self.on_point = client, grid, token_range, on_point
        self.stream_interval = stream_interval
        self._n = 0
        self._salt = secrets.randbits(31)   # no prompt of an earlier profile may still be cached

    def _ids(self, n: int, *key: int) -> list[int]:
        self._n += 1
        rng = np.random.default_rng([zlib.crc32(b"profile"), self._salt, self._n, *key])
        return rng.integers(*self.token_range, size=n).tolist()

    async def prefill_sample(self, n: int, c: int, r: int) -> tuple[float, float | None, float | None, int]:
        """One lone request: (client TTFT s, server TTFT s = scheduled -> first token, server queue s,
        context actually cached); the server figures are None where it does not report them."""
        ids = self._ids(c + n, n, c, r)
        if c:
            await self.client.stream_completion(ids[:c], 1)
        res = await self.client.stream_completion(ids, 1)
        cached = res.cached_tokens if res.cached_tokens is not None else c
        return res.first_token_s - res.sent_s, res.server_ttft_s, res.queue_s, int(cached)

    async def idle_sample(self, gap: float, r: int) -> tuple[float, float | None, float | None]:
        """A replay-shaped call (IDLE_PROMPT_TOKENS fresh ids, IDLE_OUTPUT_TOKENS streamed as the replay
        streams them) `gap` seconds after the previous response closed, as an agent's call follows
        its tool: (client time send -> stream closed, engine TTFT = scheduled -> first token, engine
        time queued -> last token); the engine figures are None where the server does not report them."""
        await self.client.stream_completion(self._ids(64, 7, r), 1)   # the engine and the API path just ran
        if gap > 0:
            await asyncio.sleep(gap)
        res = await self.client.stream_completion(self._ids(IDLE_PROMPT_TOKENS, 8, int(gap * 1e6), r),
                                                  IDLE_OUTPUT_TOKENS, stream_interval=self.stream_interval)
        engine = None
        if res.server_ttft_s is not None and res.server_decode_s is not None:
            engine = (res.queue_s or 0.0) + res.server_ttft_s + res.server_decode_s
        return res.end_s - res.sent_s, res.server_ttft_s, engine

    async def decode_sample(self, b: int, ctx: int, r: int) -> tuple[float, float] | None:
        """(mean steady-state inter-token gap s, mean context of the gaps used), or None."""
        prompts = [self._ids(ctx, b, ctx, r, j) for j in range(b)]
        results = await asyncio.gather(*(self.client.stream_completion(p, self.grid.decode_tokens) for p in prompts))
        start = max(x.first_token_s for x in results)
        end = min(x.last_token_s for x in results)
        gaps, contexts = [], []
        for x in results:
            pos = 0
            for j in range(1, len(x.chunk_times)):
                pos += x.chunk_tokens[j - 1]
                if x.chunk_times[j - 1] >= start and x.chunk_times[j] <= end:
                    k = x.chunk_tokens[j]
                    gaps.append((x.chunk_times[j] - x.chunk_times[j - 1]) / k)
                    contexts.append(ctx + pos + (k - 1) / 2.0)
        if len(gaps) < 3:
            return None
        # The mean, not the median, of the gaps: a step the engine lost to another process (a busy
        # host) is part of what a run pays per token, and the simulator sums step times.
        return float(np.mean(gaps)), float(np.mean(contexts))

    def plan(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[str]]:
        """The (N, C) prefill and (B, L) decode points the server can hold, and the ones skipped."""
        g, skipped = self.grid, []
        info = self.client.info
        pool = info.kv_pool_tokens if info and info.kv_pool_tokens else None
        bs = info.block_size if info and info.block_size else 16
        mml = info.max_model_len if info and info.max_model_len else None
        decode_points = []
        for b in g.batch_sizes:
            contexts = list(g.decode_contexts)
            if g.fill_pool and pool is not None:
                # the longest context B sequences of it (plus their outputs) fit the pool with
                nb = (pool // bs - 1) // b                     # blocks per sequence (one is vLLM's null block)
                top = nb * bs - g.decode_tokens - 1
                if mml is not None:
                    top = min(top, mml - g.decode_tokens - 1)
                fitting = [c for c in contexts if b * (-(-(c + g.decode_tokens) // bs) * bs) <= pool]
                if top > 0 and (not fitting or top > 1.25 * max(fitting)):
                    contexts.append(top)
            for ctx in contexts:
                if mml is not None and ctx + g.decode_tokens > mml:
                    skipped.append(f"decode B={b} L={ctx}: {ctx + g.decode_tokens} tokens exceed the max model length {mml}")
                elif pool is not None and b * (-(-(ctx + g.decode_tokens) // bs) * bs) > pool:
                    skipped.append(f"decode B={b} L={ctx}: {b} x {ctx + g.decode_tokens} tokens do not fit the "
                                   f"KV pool of {pool}")
                else:
                    decode_points.append((b, ctx))
        prefill_points = []
        for n in g.prefill_tokens:
            for c in g.contexts:
                if (mml is not None and n + c + 1 > mml) or (pool is not None and n + c + 1 > pool):
                    skipped.append(f"prefill N={n} C={c}: longer than the max model length {mml} or KV pool {pool}")
                else:
                    prefill_points.append((n, c))
        return prefill_points, decode_points, skipped

    def n_samples(self) -> int:
        """How many measurements run() makes (for a progress bar)."""
        pre, dec, _ = self.plan()
        g = self.grid
        return g.repeats * (PREFILL_PER_REPEAT * (len(pre) + len(g.idle_gaps)) + len(dec))

    async def run(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
        """Every point once per round, `repeats` rounds: a burst of load on a shared machine then
        spoils one sample of several points (which the median drops), not every sample of one.
        Returns the prefill, decode and idle tables and the points skipped."""
        g = self.grid
        prefill_points, decode_points, skipped = self.plan()
        pre: dict[tuple[int, int], list[tuple[float, float | None, float | None, int]]] = {p: [] for p in prefill_points}
        dec: dict[tuple[int, int], list[tuple[float, float]]] = {p: [] for p in decode_points}
        idle: dict[float, list[tuple[float, float | None, float | None]]] = {x: [] for x in g.idle_gaps}
        for r in range(PREFILL_PER_REPEAT * g.repeats):
            for n, c in prefill_points:
                pre[(n, c)].append(await self.prefill_sample(n, c, r))
                if self.on_point:
                    self.on_point(f"round {r + 1}: prefill N={n} C={c}")
            for gap in g.idle_gaps:
                idle[gap].append(await self.idle_sample(gap, r))
                if self.on_point:
                    self.on_point(f"round {r + 1}: call after {gap * 1e3:g} ms idle")
            if r % PREFILL_PER_REPEAT:
                continue
            for b, ctx in decode_points:
                x = await self.decode_sample(b, ctx, r)
                if x is not None:
                    dec[(b, ctx)].append(x)
                if self.on_point:
                    self.on_point(f"round {r // PREFILL_PER_REPEAT + 1}: decode B={b} L={ctx}")
        prefill_rows = []
        for (n, c), rep in pre.items():
            client = [x[0] for x in rep]
            server = [x[1] for x in rep if x[1] is not None]
            # The engine's own step (scheduled -> first token) where the server reports it; the rest
            # of a lone request's client TTFT is API latency (HTTP, IPC, streaming), kept apart.
            ts = server if len(server) == len(rep) else client
            lat = [x[0] - x[1] - (x[2] or 0.0) for x in rep if x[1] is not None]
            cached = int(statistics.median([x[3] for x in rep]))
            prefill_rows.append({"new_tokens": n + c - cached, "context_tokens": cached, "time_s": statistics.median(ts),
                                 "min_s": min(ts), "max_s": max(ts), "samples": len(ts),
                                 "client_ttft_s": statistics.median(client),
                                 "api_latency_s": statistics.median(lat) if lat else None})
        decode_rows = []
        for (b, ctx), rep in dec.items():
            if not rep:
                skipped.append(f"decode B={b} L={ctx}: the {b} streams never decoded together "
                               "(more than max_num_seqs, or KV-limited)")
                continue
            ts = [x[0] for x in rep]
            decode_rows.append({"batch_size": b, "context_tokens": float(np.mean([x[1] for x in rep])),
                                "step_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                                "samples": len(ts)})
        return pd.DataFrame(prefill_rows), pd.DataFrame(decode_rows), idle_table(idle), skipped


def idle_table(samples: dict[float, list[tuple[float, float | None, float | None]]]) -> pd.DataFrame:
    """Per idle gap: the engine's TTFT and its rise over the back-to-back case (wake_s), and the
    per-call API latency = client send -> stream closed minus the engine's queued -> last token
    (HTTP, input processing, IPC, output streaming and the stream's close: what Eq. 2 adds to each
    tool gap). engine_idle_s, the time the engine sat idle before the call, is gap + API latency."""
    rows = []
    for gap, rep in sorted(samples.items()):
        if not rep:
            continue
        ttft = [x[1] for x in rep if x[1] is not None]
        lat = [x[0] - x[2] for x in rep if x[2] is not None]
        api = statistics.median(lat) if lat else None
        rows.append({"gap_s": gap, "engine_idle_s": gap + (api or 0.0),
                     "engine_ttft_s": statistics.median(ttft) if ttft else None,
                     "api_latency_s": api, "client_s": statistics.median([x[0] for x in rep]), "samples": len(rep)})
    df = pd.DataFrame(rows, columns=["gap_s", "engine_idle_s", "engine_ttft_s", "api_latency_s", "client_s", "samples"])
    if len(df) and df["engine_ttft_s"].notna().all():
        base = float(df["engine_ttft_s"].iloc[0])
        df["wake_s"] = (df["engine_ttft_s"] - base).clip(lower=0.0)
    return df


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_profile(out: Path, info: ServerInfo, grid: Grid, prefill: pd.DataFrame, decode: pd.DataFrame,
                  tolerance: float, engine: dict[str, Any], skipped: list[str],
                  idle: pd.DataFrame | None = None) -> dict[str, Any]:
    """Fit, write prefill.csv / decode.csv (with fit_s and error per point), idle.csv and profile.json."""
    if len(prefill) < 3 or len(decode) < 3:
        raise LiveError(f"too few measured points to fit (prefill {len(prefill)}, decode {len(decode)}; need 3 each): "
                        "widen the grids")
    f = fit(prefill, decode)
    p, d = point_errors(f, prefill, decode)
    lat = prefill["api_latency_s"].dropna() if "api_latency_s" in prefill else pd.Series(dtype=float)
    server_timed = len(lat) == len(prefill) and len(prefill) > 0
    idle = idle if idle is not None else pd.DataFrame()
    call_lat = idle["api_latency_s"].dropna() if "api_latency_s" in idle else pd.Series(dtype=float)
    worst = float(max(p["error"].abs().max(), d["error"].abs().max()))
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "prefill.csv", p.to_csv(index=False))
    _atomic_write(out / "decode.csv", d.to_csv(index=False))
    if len(idle):
        _atomic_write(out / "idle.csv", idle.to_csv(index=False))
    elif (out / "idle.csv").exists():
        (out / "idle.csv").unlink()   # a stale table of an earlier profile must not time this one
    meta = {
        "format": PROFILE_FORMAT,
        "server": info.url, "model": info.model, "server_version": info.version,
        "max_model_len": info.max_model_len, "block_size": info.block_size, "kv_pool_tokens": info.kv_pool_tokens,
        "engine": engine,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid": asdict(grid), "skipped": skipped,
        "fit": f.to_json(),
        "tolerance": tolerance,
        "max_abs_error": worst,
        "mean_abs_error": float(pd.concat([p["error"], d["error"]]).abs().mean()),
        "within_tolerance": worst <= tolerance,
        "prefill_timing": "server" if server_timed else "client",
        # per call: client send -> stream closed, minus the engine's queued -> last token (idle.csv)
        "api_latency_s": float(call_lat.median()) if len(call_lat) else 0.0,
        # the older, narrower figure: client TTFT - engine TTFT - queue of the lone prefill requests
        "api_latency_first_token_s": float(lat.median()) if server_timed else None,
        "wake_s_max": float(idle["wake_s"].max()) if "wake_s" in idle and len(idle) else None,
        "method": "black-box: prefill = time to first token of a lone request over a cached prefix (the server's "
                  "scheduled -> first token where it reports per-request metrics, else the client's), sent right "
                  "after the previous one; decode step = mean inter-token gap while B streams decode together "
                  "(median over repeats); idle.csv: a replay-shaped call after an idle gap: wake_s = its engine "
                  "TTFT minus the back-to-back one, api_latency_s = client send -> stream closed minus the "
                  "engine's queued -> last token (HTTP, input processing, IPC, streaming), median",
    }
    _atomic_write(out / "profile.json", json.dumps(meta, indent=2) + "\n")
    return {"meta": meta, "prefill": p, "decode": d, "idle": idle}


async def idle_check(client: ServerClient) -> str | None:
    m = await client.metrics()
    if m is None:
        return None
    busy = (metric_value(m, "vllm:num_requests_running", client.model) or 0) + \
        (metric_value(m, "vllm:num_requests_waiting", client.model) or 0)
    if busy:
        return f"the server has {int(busy)} requests in flight: a profile needs it idle, figures will be inflated"
    return None
