"""Profiled step-time tables: CSV loading with one-line errors, isotonic smoothing, and the
4-D attention grid (multilinear interpolation memoised per grid cell)."""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.config import ModelSpec

from .errors import UserError

ATTN_AXES = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")


class PerfTableError(UserError, ValueError):
    """A profiled table that is missing or malformed; the message is one line with the path."""


def read_table(path: Path, columns: Sequence[str], *, min_rows: int = 1,
               error: type[UserError] = PerfTableError) -> pd.DataFrame:
    """Load a CSV, checking the columns are present, numeric, finite and non-negative (a `layer`
    column is a name; `overhead_us` may be negative) and that it has `min_rows` rows; problems
    raise `error` with a one-line message naming the file."""
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise error(f"{path}: table file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise error(f"{path}: unreadable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise error(f"{path}: missing columns {missing}")
    for c in columns:
        if c == "layer":
            continue
        vals = pd.to_numeric(df[c], errors="coerce")
        bad = ~np.isfinite(vals.to_numpy(float))
        if bad.any():
            raise error(f"{path}: column '{c}' has non-numeric or infinite values (row {int(bad.argmax()) + 2})")
        if c != "overhead_us" and (vals < 0).any():
            raise error(f"{path}: column '{c}' has negative values")
        df[c] = vals
    if len(df) < min_rows:
        raise error(f"{path}: no rows" if df.empty else f"{path}: needs at least {min_rows} rows, has {len(df)}")
    return df


def isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators); points already in order stay put."""
    vals, counts = [], []
    for v in map(float, y):
        vals.append(v)
        counts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            n = counts[-2] + counts[-1]
            vals[-2] = (vals[-2] * counts[-2] + vals[-1] * counts[-1]) / n
            counts[-2] = n
            del vals[-1], counts[-1]
    return np.repeat(vals, counts)


def extend_linear(x: np.ndarray, y: np.ndarray, n: int) -> list[float]:
    """y at integers 0..n-1 by linear interpolation; beyond x[-1] the last octave's slope."""
    grid = np.arange(n, dtype=float)
    out = np.interp(grid, x, y)
    hi = grid > x[-1]
    if hi.any():
        j = int(np.searchsorted(x, x[-1] / 2))
        slope = (y[-1] - y[j]) / max(x[-1] - x[j], 1.0)
        out[hi] = y[-1] + slope * (grid[hi] - x[-1])
    return out.tolist()


class AttentionGrid:
    """Multilinear interpolation on the 4-D attention grid, memoised per grid cell.

    Raw (not log) axes: decode attention ~ n x kv is bilinear, so a cell's interpolant is
    exact for it; beyond the last grid line the last cell extrapolates linearly.
    """

    def __init__(self, axes: list[list[float]], values: np.ndarray):
        self.axes, self.values = axes, values
        self._cells: dict[tuple[int, ...], tuple[float, ...]] = {}
        self._top = [len(a) - 2 for a in axes]
        self.floor = float(values.min())

    def _cell(self, idx: tuple[int, ...]) -> tuple[float, ...]:
        c = self._cells.get(idx)
        if c is None:
            block = self.values[tuple(slice(i, i + 2) for i in idx)]
            c = self._cells[idx] = tuple(block.ravel().tolist())
        return c

    def __call__(self, *point: float) -> float:
        """Value at a point (one coordinate per axis); unrolled for 2 and 4 axes (hot path)."""
        idx, w = [], []
        for ax, top, x in zip(self.axes, self._top, point):
            i = bisect.bisect_right(ax, x) - 1
            i = 0 if i < 0 else (top if i > top else i)
            idx.append(i)
            w.append((x - ax[i]) / (ax[i + 1] - ax[i]))
        key = tuple(idx)
        v = self._cells.get(key) or self._cell(key)
        if len(w) == 2:
            lo, hi = v[0] + w[1] * (v[1] - v[0]), v[2] + w[1] * (v[3] - v[2])
            return lo + w[0] * (hi - lo)
        wa, wb, wc, wd = w
        a0, a1, a2, a3 = v[0] + wd * (v[1] - v[0]), v[2] + wd * (v[3] - v[2]), v[4] + wd * (v[5] - v[4]), \
            v[6] + wd * (v[7] - v[6])
        a4, a5, a6, a7 = v[8] + wd * (v[9] - v[8]), v[10] + wd * (v[11] - v[10]), v[12] + wd * (v[13] - v[12]), \
            v[14] + wd * (v[15] - v[14])
        b0, b1, b2, b3 = a0 + wc * (a1 - a0), a2 + wc * (a3 - a2), a4 + wc * (a5 - a4), a6 + wc * (a7 - a6)
        c0, c1 = b0 + wb * (b1 - b0), b2 + wb * (b3 - b2)
        return c0 + wa * (c1 - c0)


def load_attention(path: Path) -> AttentionGrid:
    """attention.csv -> full 4-D grid; cells the profiler skips are filled by their meaning:
    chunk 0 ignores kv_prefill, n_decode 0 ignores kv_decode, a decode context below 16 is
    treated as 16, n_decode beyond the grid (256 with a prefill) extrapolates linearly.
    The decode-only and prefill-only slices are made non-decreasing (isotonic; they differ
    from monotone by measurement noise of ~1-3 %); mixed cells stay as measured, since the
    fused kernel's split heuristics make some of them genuinely non-monotone (RTX: up to 30 %)."""
    df = read_table(path, (*ATTN_AXES, "time_us"))
    axes = [sorted(df[a].unique().tolist()) for a in ATTN_AXES]
    shape = tuple(len(a) for a in axes)
    if min(shape) < 2 or axes[0][0] != 0 or axes[2][0] != 0:
        raise PerfTableError(f"{path}: expected a grid starting at 0 with >= 2 points per axis")
    pos = [{v: i for i, v in enumerate(a)} for a in axes]
    vals = np.full(shape, np.nan)
    for row in df[[*ATTN_AXES, "time_us"]].itertuples(index=False):
        vals[tuple(p[v] for p, v in zip(pos, row[:4]))] = row[4]
    vals[:, :, 1:, 0] = vals[:, :, 1:, 1]           # decode context 0 -> smallest measured
    vals[0, 0, 0, :] = np.nanmin(vals)              # empty batch: launch floor only
    vals[0, :] = vals[0, :1]                        # no prefill: kv_prefill irrelevant
    vals[:, :, 0, :] = vals[:, :, 0, :1]            # no decode: kv_decode irrelevant
    for n in range(2, shape[2]):                    # missing n_decode rows: extrapolate
        gap = np.isnan(vals[:, :, n, :])
        vals[:, :, n, :][gap] = (2 * vals[:, :, n - 1, :] - vals[:, :, n - 2, :])[gap]
    dec = np.apply_along_axis(isotonic, 0, np.apply_along_axis(isotonic, 1, vals[0, 0]))
    pre = np.apply_along_axis(isotonic, 0, np.apply_along_axis(isotonic, 1, vals[:, :, 0, 0]))
    vals[0, :] = dec
    vals[:, :, 0, :] = pre[:, :, None]
    if np.isnan(vals).any():
        raise PerfTableError(f"{path}: grid has holes that cannot be filled")
    return AttentionGrid([[float(v) for v in a] for a in axes], vals)


def rescale_attention(src: AttentionGrid, src_model: ModelSpec, model: ModelSpec) -> AttentionGrid:
    """Another model's attention grid on the same device, rescaled per term: the prefill part
    (compute-bound) by query heads x head_dim, the decode part (KV-read-bound) by kv_heads x
    head_dim; the launch floor is kept."""
    r_q = model.heads * model.head_dim / (src_model.heads * src_model.head_dim)
    r_kv = model.kv_heads * model.head_dim / (src_model.kv_heads * src_model.head_dim)
    v, floor = src.values, src.floor
    prefill_only = v[:, :, :1, :1]
    out = floor + (prefill_only - floor) * r_q + (v - prefill_only) * r_kv
    out[0] = floor + (v[0] - floor) * r_kv         # chunk 0: decode only
    return AttentionGrid(src.axes, out)
