"""Roofline step-time parts for hardware/model pairs without profiled tables.

Dense ops and lm_head cost max(flops / (peak * eff_c), bytes / (bw * eff_m), floor): weights
are read once per step and every kernel pays at least a launch floor. Attention is additive,
setup + flops / (peak * eff_c) + KV bytes / (bw * eff_m): the measured kernels do not saturate
either roof at moderate sizes, and a max() form underestimated the tables by ~50 % at the
median. Efficiency factors are fitted to the measured tables by `fit_params` and frozen in FITTED;
tests/test_perf.py refits them and checks the frozen values, and states how far the
roofline lands from every table grid point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.config import HardwareSpec, ModelSpec

# GEMMs of one transformer layer and the elementwise kernels around them.
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
ELEMENTWISE = ("layernorm", "layernorm", "rotary_emb", "act_fn")


@dataclass(frozen=True)
class RooflineParams:
    eff_gemm_c: float   # achieved / peak bf16 FLOP/s in large GEMMs
    eff_gemm_m: float   # achieved / peak bandwidth streaming weights (decode GEMMs)
    eff_attn_c: float   # achieved / peak FLOP/s in prefill attention
    eff_attn_m: float   # achieved / peak bandwidth reading KV in decode attention
    floor_us: float     # smallest kernel time (launch + tail)
    attn_floor_us: float  # fixed cost of one attention launch (setup, scheduling metadata)


# Fitted with fit_params on B200 Llama-3.1-8B TP1 and RTX PRO 6000 Llama-3.1-70B TP2
# (the two folders with every table); other devices use their geometric mean.
FITTED: dict[str, RooflineParams] = {
    "B200": RooflineParams(0.968, 0.622, 0.477, 0.858, 3.64, 11.68),
    "RTXPRO6000": RooflineParams(0.86, 0.812, 0.497, 0.785, 3.15, 12.21),
}
DEFAULT = RooflineParams(*(math.sqrt(getattr(FITTED["B200"], f) * getattr(FITTED["RTXPRO6000"], f))
                           for f in RooflineParams.__dataclass_fields__))
# Per-step host overhead when no step_overhead table exists: decode rows of the four tables
# have median overhead_us near zero (-0.4..+0.3 ms); 0.3 ms is the largest typical positive
# value (B200 70B n=1, RTX 8B n=8), a conservative per-step CPU cost.
STEP_OVERHEAD_US = 300.0


def params_for(hw: HardwareSpec) -> RooflineParams:
    return FITTED.get(hw.key, DEFAULT)


class Roofline:
    """Per-GPU kernel times (microseconds) for one (hardware, model, tp) from specs alone."""

    def __init__(self, hw: HardwareSpec, model: ModelSpec, tp: int, params: RooflineParams | None = None):
        self.hw, self.model, self.tp = hw, model, tp
        self.p = params or params_for(hw)
        self.flops_us = hw.peak_bf16_tflops * 1e6     # FLOP per microsecond
        self.bytes_us = hw.mem_bw_tbs * 1e6           # byte per microsecond
        m = model
        q, kv = m.heads * m.head_dim // tp, m.kv_heads * m.head_dim // tp
        inter = m.intermediate // tp
        # (rows, cols) of each per-GPU weight: qkv and gate_up are column-parallel, o and down row-parallel.
        self.shapes = {"qkv_proj": (m.hidden, q + 2 * kv), "o_proj": (q, m.hidden),
                       "gate_up_proj": (m.hidden, 2 * inter), "down_proj": (inter, m.hidden)}
        self.q_dim, self.kv_dim = q, kv

    def _op(self, flops: float, nbytes: float, eff_c: float, eff_m: float) -> float:
        return max(flops / (self.flops_us * eff_c), nbytes / (self.bytes_us * eff_m), self.p.floor_us)

    def gemm_us(self, name: str, tokens: float) -> float:
        k, n = self.shapes[name]
        return self._op(2.0 * tokens * k * n, 2.0 * (k * n + tokens * (k + n)), self.p.eff_gemm_c, self.p.eff_gemm_m)

    def elementwise_us(self, name: str, tokens: float) -> float:
        width = {"act_fn": 3 * self.shapes["down_proj"][0], "rotary_emb": 2 * (self.q_dim + self.kv_dim)}
        return self._op(0.0, 2.0 * tokens * width.get(name, 2 * self.model.hidden), 1.0, self.p.eff_gemm_m)

    def layer_dense_us(self, tokens: float) -> float:
        return sum(self.gemm_us(g, tokens) for g in GEMMS) + sum(self.elementwise_us(e, tokens) for e in ELEMENTWISE)

    def dense_step_us(self, tokens: float) -> float:
        """All layers' dense ops plus embedding and final norm, per GPU."""
        return self.model.layers * self.layer_dense_us(tokens) + 2 * self.elementwise_us("layernorm", tokens)

    def per_sequence_us(self, seqs: float) -> float:
        """lm_head (vocab-parallel) plus sampler for `seqs` sampled sequences."""
        v, h = self.model.vocab // self.tp, self.model.hidden
        lm = self._op(2.0 * seqs * h * v, 2.0 * h * v, self.p.eff_gemm_c, self.p.eff_gemm_m)
        return lm + self._op(0.0, 4.0 * seqs * v, 1.0, self.p.eff_gemm_m)

    def attention_us(self, chunk: float, kv_prefill: float, n_decode: float, kv_decode: float) -> float:
        """One layer's attention: one prefill chunk over its cached tokens plus n_decode
        sequences of kv_decode context each (prefill flops ~ 4*chunk*(kv+chunk/2)*heads*head_dim)."""
        flops, kv_read = self.attention_work(chunk, kv_prefill, n_decode, kv_decode)
        if kv_read == 0.0:
            return 0.0
        return self.p.attn_floor_us + flops / (self.flops_us * self.p.eff_attn_c) \
            + kv_read / (self.bytes_us * self.p.eff_attn_m)

    def attention_work(self, chunk: Any, kv_prefill: Any, n_decode: Any, kv_decode: Any) -> tuple[Any, Any]:
        """(flops, KV bytes) of one layer's attention, per GPU; works on numpy arrays too."""
        flops = 4.0 * self.q_dim * (chunk * (kv_prefill + chunk / 2.0) + n_decode * kv_decode)
        return flops, 4.0 * self.kv_dim * (kv_prefill + chunk + n_decode * kv_decode)   # K+V, 2 B each

    def decode_kv_breaks(self, n_decode: int) -> list[float]:
        """Context lengths where decode attention (for fixed n_decode) stops being linear: none."""
        return []


def fit_params(roof: Roofline, dense: dict[str, np.ndarray], tokens: np.ndarray,
               attention: dict[str, np.ndarray]) -> RooflineParams:
    """Efficiency factors from one profiled folder (per-GPU shapes as in `roof`).

    floor: median of the elementwise kernels at <= 16 tokens; eff_gemm_m: weight bytes over
    bandwidth against the GEMMs at <= 16 tokens (weight-streaming regime); eff_gemm_c: GEMM
    flops over peak against the GEMMs at the largest token count. Attention (columns of
    attention.csv as arrays): attn_floor and eff_attn_m by least squares in relative error on
    the decode-only rows, then eff_attn_c likewise on the prefill-only rows with those fixed.
    """
    small = tokens <= 16
    floor = float(np.median(np.concatenate([dense[e][small] for e in ("layernorm", "rotary_emb", "act_fn")])))
    w_bytes = sum(2.0 * k * n for k, n in roof.shapes.values())
    gemm_small = float(np.median(sum(dense[g][small] for g in GEMMS)))
    top = int(np.argmax(tokens))
    g_flops = sum(2.0 * float(tokens[top]) * k * n for k, n in roof.shapes.values())
    eff_gm = w_bytes / roof.bytes_us / gemm_small
    eff_gc = g_flops / roof.flops_us / float(sum(dense[g][top] for g in GEMMS))
    c, kp, n, kv, t = (np.asarray(attention[k], float) for k in
                       ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
    flops, kv_bytes = roof.attention_work(c, kp, n, kv)
    f, b = flops / roof.flops_us, kv_bytes / roof.bytes_us
    dec, pre = c == 0, n == 0
    x = np.stack([np.ones(dec.sum()), b[dec]], axis=1) / t[dec, None]
    (a0, xm), *_ = np.linalg.lstsq(x, np.ones(dec.sum()), rcond=None)
    r = t[pre] - a0 - b[pre] * xm
    xc = float(np.sum(f[pre] * r / t[pre] ** 2) / np.sum(f[pre] ** 2 / t[pre] ** 2))
    return RooflineParams(round(eff_gc, 3), round(eff_gm, 3), round(1 / xc, 3), round(1 / float(xm), 3),
                          round(floor, 2), round(float(a0), 2))
