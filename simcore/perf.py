"""Performance model: one engine step (a batch) -> wall time in seconds.

step = kernels + TP all-reduce + host overhead, all per GPU (TP ranks run in lockstep):
- kernels: per-layer dense ops x layers + embedding + final norm (dense.csv, by token count),
  lm_head + sampler (per_sequence.csv, by sequences sampled = decodes + prefills: vLLM v1
  computes logits for every scheduled request), attention x layers (attention.csv grid).
- all-reduce: 2 per layer of tokens x hidden x 2 B at an effective bandwidth, plus a
  per-all-reduce latency, both fitted to wall - kernel - overhead of step_overhead.csv where
  TP > 1 (RTX PRO 6000 TP2: 35.2 GB/s, latency 0 -- that residual is a pure bandwidth term;
  the extra kernel_us of the decode rows is attention at contexts the rows do not record:
  it implies the same ~70k decode tokens at n=4 and 8 in the TP1 and TP2 tables alike).
- host overhead: step_overhead.csv's overhead_us, smoothed (see _Overhead).
Missing tables fall back to simcore.roofline, part by part.

Batch shape conventions: decode sequences are represented by their mean context (the
attention table has n_decode sequences of equal context; decode attention is linear in
total KV read, so the mean is exact up to interpolation). Several prefills: the largest
is looked up jointly with the decodes (one varlen kernel in vLLM); each further prefill
adds its own prefill-only attention minus the table's launch floor, since it rides in
the same kernel launch. Dense ops use the total token count.
"""
from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.config import Cell, HardwareSpec, ModelSpec, model_catalog, profiles_root
from simcore.perftables import (  # noqa: F401  (ATTN_AXES, PerfTableError re-exported)
    ATTN_AXES, AttentionGrid, PerfTableError, extend_linear, isotonic, load_attention, read_table, rescale_attention)
from simcore.roofline import STEP_OVERHEAD_US, Roofline

DENSE_OPS = ("qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn", "down_proj")


class _Overhead:
    """Host overhead (us) by (prefill tokens, n_decode) from step_overhead.csv.

    Smooth model: decode-only rows (chunk 0) are interpolated in n_decode (clamped to the
    profiled range): they are clean, e.g. B200 8B -0.34 ms at n=12 falling steadily to
    -0.57 ms at n=120. For each profiled chunk > 0 the median over its n_decode rows, since
    those rows scatter without a trend (RTX 70B chunk 256: 18.5, 5.3, 0.5 ms at n = 4, 8, 12;
    B200 8B chunk 64: 0.7-7.4 ms). Linear in the chunk between profiled chunks, the last
    segment's slope beyond. Negative values are kept: decode rows on B200 8B are consistently
    -0.3..-0.6 ms (the per-op profile overstates a step); clamping would bias TPOT by ~10 %.
    Duplicate (chunk, n_decode) rows
    (RTX 70B at 16384): the faster run is kept; its kernel_us matches the per-layer tables
    within 0.5 %, the other run's is 34 % higher throughout (a throttled run).
    """

    def __init__(self, df: pd.DataFrame):
        df = df.sort_values("wall_us").drop_duplicates(["prefill_chunk", "n_decode"])
        self.rows = df.sort_values(["prefill_chunk", "n_decode"]).reset_index(drop=True)
        med = self.rows.groupby("prefill_chunk")["overhead_us"].median()
        self.chunks = [float(c) for c in med.index]
        self.values = [float(v) for v in med.to_numpy()]
        dec = self.rows[self.rows["prefill_chunk"] == 0]
        self._dec_n = dec["n_decode"].to_numpy(float)
        self._dec_v = dec["overhead_us"].to_numpy(float)
        self._dec: dict[float, float] = {}

    def _decode(self, n: float) -> float:
        v = self._dec.get(n)
        if v is None:
            v = self._dec[n] = float(np.interp(n, self._dec_n, self._dec_v)) if len(self._dec_n) else self.values[0]
        return v

    def __call__(self, prefill_tokens: float, n_decode: float) -> float:
        ch, val = self.chunks, self.values
        j = bisect.bisect_right(ch, prefill_tokens) - 1
        j = 0 if j < 0 else (len(ch) - 2 if j > len(ch) - 2 else j)
        lo = self._decode(n_decode) if j == 0 and ch[0] == 0 else val[j]
        if len(ch) == 1:
            return lo
        return lo + (prefill_tokens - ch[j]) * (val[j + 1] - lo) / (ch[j + 1] - ch[j])


def fit_allreduce(rows: pd.DataFrame, model: ModelSpec) -> tuple[float, float]:
    """(effective GB/s, intercept us per all-reduce) from the residual wall - kernel - overhead
    of step_overhead rows, by least squares against bytes per all-reduce."""
    n_ar = 2 * model.layers
    resid = (rows["wall_us"] - rows["kernel_us"] - rows["overhead_us"]).to_numpy(float) / n_ar
    nbytes = (rows["prefill_chunk"] + rows["n_decode"]).to_numpy(float) * model.hidden * 2
    slope, icept = np.polyfit(nbytes, resid, 1)
    return float(1e-3 / slope), float(icept)


class PerfModel:
    """Step times for one (hardware, model, tp); see the module docstring for the model."""

    MAX_TOKENS = 1 << 16     # dense lookup array length; beyond it, computed on the fly

    def __init__(self, hw: HardwareSpec, model: ModelSpec, tp: int, folder: Path | None = None,
                 attention_from: tuple[Path, ModelSpec] | None = None):
        self.hw, self.model, self.tp = hw, model, tp
        self.roof = Roofline(hw, model, tp)
        self.layers = model.layers
        parts = {}
        have = lambda name: folder is not None and (folder / name).exists()   # noqa: E731
        # Dense ops: per-GPU step total at every token count, isotonic in tokens.
        if folder is not None:
            d = read_table(folder / "dense.csv", ("layer", "tokens", "time_us"))
            p = d.pivot_table(index="tokens", columns="layer", values="time_us", aggfunc="mean")
            miss = [op for op in (*DENSE_OPS, "layernorm", "embedding", "final_layernorm") if op not in p.columns]
            if miss or p.isna().any().any():
                raise PerfTableError(f"{folder / 'dense.csv'}: missing ops {miss or 'at some token counts'}")
            self.dense_ops = p
            total = self.layers * (p[list(DENSE_OPS)].sum(axis=1) + 2 * p["layernorm"]) \
                + p["embedding"] + p["final_layernorm"]   # Llama: two RMSNorms per layer
            x = p.index.to_numpy(float)
            self._dense = extend_linear(np.concatenate([[0.0], x]), np.concatenate([[0.0], isotonic(total.to_numpy())]),
                                  self.MAX_TOKENS)
            parts["dense"] = "profile"
        else:
            # piecewise linear in tokens (max of lines): every count to 256, then every 16th
            x = np.unique(np.concatenate([np.arange(0, 257), np.arange(256, 16385, 16)])).astype(float)
            y = np.array([self.roof.dense_step_us(t) if t else 0.0 for t in x])
            self._dense = extend_linear(x, y, self.MAX_TOKENS)
            parts["dense"] = "roofline"
        # lm_head + sampler by sequences sampled.
        if have("per_sequence.csv"):
            s = read_table(folder / "per_sequence.csv", ("layer", "sequences", "time_us"))
            q = s.pivot_table(index="sequences", columns="layer", values="time_us", aggfunc="mean")
            if {"lm_head", "sampler"} - set(q.columns) or q.isna().any().any():
                raise PerfTableError(f"{folder / 'per_sequence.csv'}: needs lm_head and sampler at every count")
            x = np.concatenate([[0.0], q.index.to_numpy(float)])
            y = np.concatenate([[0.0], isotonic((q["lm_head"] + q["sampler"]).to_numpy())])
            self._seq = extend_linear(x, y, 4097)
            parts["per_sequence"] = "profile"
        else:
            self._seq = [0.0] + [self.roof.per_sequence_us(s) for s in range(1, 4097)]
            parts["per_sequence"] = "roofline"
        # Attention grid: own table, a sibling model's table rescaled, or the roofline.
        self.attn: AttentionGrid | None = None
        if have("attention.csv"):
            self.attn = load_attention(folder / "attention.csv")
            parts["attention"] = "profile"
        elif attention_from is not None:
            self.attn = rescale_attention(load_attention(attention_from[0]), attention_from[1], model)
            parts["attention"] = f"profile rescaled from {attention_from[1].key}"
        else:
            parts["attention"] = "roofline"
        # All-reduce and host overhead.
        self.ar_gbs, self.ar_lat_us = hw.allreduce_gbs, 0.0
        if folder is not None:
            so = read_table(folder / "step_overhead.csv", ("prefill_chunk", "n_decode", "wall_us", "kernel_us",
                                                           "overhead_us"))
            self.overhead = _Overhead(so)
            if tp > 1:
                gbs, icept = fit_allreduce(self.overhead.rows, model)
                if 0 < gbs < 1e5:   # rows without an all-reduce residual keep the hardware default
                    self.ar_gbs, self.ar_lat_us = gbs, max(icept, 0.0)
            parts["overhead"] = "profile"
        else:
            self.overhead = lambda prefill_tokens, n_decode: STEP_OVERHEAD_US   # noqa: E731
            parts["overhead"] = "roofline"
        self.parts = parts
        kinds = {"roofline" if v == "roofline" else "profile" for v in parts.values()}
        self.source = kinds.pop() if len(kinds) == 1 else "profile+roofline"
        self._n_ar = 2 * self.layers if tp > 1 else 0
        self._ar_us_per_token = model.hidden * 2 / (self.ar_gbs * 1e3)
        self._lines: dict[int, tuple[list[float], list[float], list[float], float]] = {}
        if self.attn is not None:   # prefill-only slice, for the second and later prefills of a step
            self._attn_prefill = AttentionGrid(self.attn.axes[:2], self.attn.values[:, :, 0, 0])

    # -- parts (microseconds, per GPU) -------------------------------------------------
    def dense_us(self, tokens: int) -> float:
        if tokens < self.MAX_TOKENS:
            return self._dense[tokens]
        return self._dense[-1] + (self._dense[-1] - self._dense[-2]) * (tokens - self.MAX_TOKENS + 1)

    def seq_us(self, seqs: int) -> float:
        return self._seq[seqs] if seqs < len(self._seq) else self._seq[-1] * seqs / (len(self._seq) - 1)

    def attention_layer_us(self, chunk: float, kv_prefill: float, n_decode: float, kv_decode: float) -> float:
        if self.attn is not None:
            return self.attn(chunk, kv_prefill, n_decode, kv_decode)
        return self.roof.attention_us(chunk, kv_prefill, n_decode, kv_decode)

    def _prefill_extra_us(self, chunk: float, cached: float) -> float:
        if self.attn is not None:
            return self._attn_prefill(chunk, cached) - self.attn.floor
        return self.roof.attention_us(chunk, cached, 0, 0) - self.roof.p.attn_floor_us

    def comm_us(self, tokens: int) -> float:
        return self._n_ar * (self.ar_lat_us + tokens * self._ar_us_per_token)

    def _decode_line(self, n: int) -> tuple[list[float], list[float], list[float], float]:
        """Decode-only step for n sequences as a piecewise-linear function of the mean
        context v: (breaks, value at break, slope after break) for one layer's attention,
        plus everything that does not depend on v. Memoised per n."""
        line = self._lines.get(n)
        if line is None:
            if self.attn is not None:
                br = self.attn.axes[3]
            else:
                br = sorted({0.0, *self.roof.decode_kv_breaks(n), 2.0 ** 17})
            g = [self.attention_layer_us(0, 0, n, v) for v in br]
            sl = [(g[j + 1] - g[j]) / (br[j + 1] - br[j]) for j in range(len(br) - 1)]
            fixed = self.dense_us(n) + self.seq_us(n) + self.comm_us(n) + self.overhead(0, n)
            line = self._lines[n] = (br, g, sl + sl[-1:], fixed)
        return line

    def kernel_us(self, prefills: Sequence[tuple[int, int]], n_decode: int, decode_kv_sum: int) -> float:
        kv_mean = decode_kv_sum / n_decode if n_decode else 0.0
        if not prefills:
            return self.dense_us(n_decode) + self.seq_us(n_decode) + self.layers * self.attention_layer_us(
                0, 0, n_decode, kv_mean)
        if len(prefills) == 1:
            (c0, k0), extra, tokens = prefills[0], 0.0, n_decode + prefills[0][0]
        else:
            ordered = sorted(prefills, reverse=True)
            (c0, k0), tokens = ordered[0], n_decode + sum(p[0] for p in prefills)
            extra = sum(self._prefill_extra_us(c, k) for c, k in ordered[1:])
        if n_decode or self.attn is None:
            attn = self.attention_layer_us(c0, k0, n_decode, kv_mean)
        else:
            attn = self._attn_prefill(c0, k0)
        return self.dense_us(tokens) + self.seq_us(n_decode + len(prefills)) + self.layers * (attn + extra)

    # -- interface ------------------------------------------------------------------------
    def step_time(self, prefills: Sequence[tuple[int, int]], n_decode: int, decode_kv_sum: int) -> float:
        """Seconds for one engine step (see module docstring for how the batch is combined)."""
        if not prefills:   # decode-only fast path (the bulk of the calls)
            if n_decode <= 0:
                return 0.0
            br, g, sl, fixed = self._lines.get(n_decode) or self._decode_line(n_decode)
            v = decode_kv_sum / n_decode
            j = bisect.bisect_right(br, v) - 1
            return (fixed + self.layers * (g[j] + (v - br[j]) * sl[j])) * 1e-6
        prefill_tokens = prefills[0][0] if len(prefills) == 1 else sum(p[0] for p in prefills)
        us = self.kernel_us(prefills, n_decode, decode_kv_sum) + self.comm_us(prefill_tokens + n_decode)
        return (us + self.overhead(prefill_tokens, n_decode)) * 1e-6

    def decode_steps_time(self, n_decode: int, decode_kv_sum: int, steps: int) -> float:
        """Sum of `steps` decode-only steps, the mean context growing by one per step.

        Everything but attention is constant, and attention is piecewise linear in the mean
        context (bilinear grid cells, or the roofline's single line), so the sum is exact
        per linear piece: count x value at the piece's mean context. O(pieces crossed)."""
        if steps <= 0 or n_decode <= 0:
            return 0.0
        br, g, sl, fixed = self._lines.get(n_decode) or self._decode_line(n_decode)
        v0 = decode_kv_sum / n_decode
        total, k = 0.0, 0
        while k < steps:
            j = bisect.bisect_right(br, v0 + k) - 1
            # last step k' whose context v0 + k' is still before the next break
            end = steps - 1 if j + 1 >= len(br) else min(steps - 1, max(k, math.ceil(br[j + 1] - v0) - 1))
            cnt = end - k + 1
            total += cnt * (g[j] + (v0 + 0.5 * (k + end) - br[j]) * sl[j])
            k = end + 1
        return (steps * fixed + self.layers * total) * 1e-6

    def kv_transfer_time(self, tokens: int) -> float:
        """Host<->device copy of `tokens` tokens of KV; each GPU moves its 1/tp share in parallel."""
        return tokens * self.model.kv_bytes_per_token / self.tp / (self.hw.host_link_gbs * 1e9)


def profile_folder(hw: HardwareSpec, model: ModelSpec, tp: int) -> Path | None:
    if not hw.profile:
        return None
    folder = profiles_root() / hw.profile / model.hf_name / "bf16" / f"tp{tp}"
    return folder if folder.is_dir() else None


def build_perf_model(cell: Cell) -> PerfModel:
    """The profiled tables for the cell's (hardware, model, tp) if they exist, else the roofline.
    Models are cached per (hardware, model, tp): loading costs ~0.1 s, a whole simulation ~0.3 s,
    and a PerfModel's only state is memoised lookups, so simulations can share one.
    A cell that names a measured profile directory (`evolve profile`) is timed by it."""
    if cell.profile:
        from simcore.perf_measured import load_measured
        return load_measured(cell.profile, cell.model.kv_bytes_per_token, cell.tp,  # type: ignore[return-value]
                             cell.hardware.host_link_gbs)
    return _build(cell.hardware, cell.model, cell.tp)


@functools.lru_cache(maxsize=32)
def _build(hw: HardwareSpec, model: ModelSpec, tp: int) -> PerfModel:
    folder = profile_folder(hw, model, tp)
    donor = None
    if folder is not None and tp == 1 and not (folder / "attention.csv").exists():
        for other in model_catalog().values():       # same device, another model's attention grid
            f = profile_folder(hw, other, 1) if other.key != model.key else None
            if f is not None and (f / "attention.csv").exists() and other.kv_heads == model.kv_heads:
                donor = (f / "attention.csv", other)
                break
    return PerfModel(hw, model, tp, folder, donor)
