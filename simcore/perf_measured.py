"""Performance model from a measured profile directory (`evolve profile`, black-box).

A user's own deployment has no per-layer kernel tables, only what its HTTP API shows: the
time to first token of a lone request (prefill) and the inter-token latency of B streams
decoding together (decode step). `evolve profile` measures both over grids and writes

    PROFILE_DIR/profile.json   server, model, block size, KV pool, grids, fit, errors
    PROFILE_DIR/prefill.csv    new_tokens, context_tokens, time_s, min_s, max_s, samples
    PROFILE_DIR/decode.csv     batch_size, context_tokens, step_s, min_s, max_s, samples

and this module fits the step-time model the simulator uses (the fit is redone from the
CSVs on load, so the tables are the source of truth and may be edited or extended):

    prefill(N new tokens over C cached)   = a0 + a1 N + a2 N (C + N/2)
    decode step(B sequences, mean ctx L)  = b0 + b1 B + b2 B L

N (C + N/2) is the attention work of a causal chunk (each new token reads the cached
context and the new tokens before it); B L is the KV read by a decode step. Both are fitted
by least squares on relative error with non-negative coefficients (a coefficient that would
go negative is dropped and the rest refitted). A step that mixes prefills and decodes is
charged max(a0, b0) once plus every variable term: a prefill's fixed cost measured on a lone
request includes the server's per-request overhead, which the batch pays once.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from simcore.config import ConfigError
from simcore.perftables import read_table

PROFILE_FORMAT = "agentservesim-measured-profile/1"
PREFILL_COLUMNS = ("new_tokens", "context_tokens", "time_s")
DECODE_COLUMNS = ("batch_size", "context_tokens", "step_s")
IDLE_COLUMNS = ("engine_idle_s", "wake_s")


class MeasuredProfileError(ConfigError):
    """A measured profile directory that is missing or malformed; one line naming the file."""


def _nnls_rel(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative error, coefficients >= 0 (active set: drop the most negative)."""
    w = 1.0 / np.maximum(y, 1e-12)
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(X[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            return coef
        del active[int(np.argmin(sol))]
    return coef


def prefill_features(n: np.ndarray, c: np.ndarray) -> np.ndarray:
    n, c = np.asarray(n, float), np.asarray(c, float)
    return np.column_stack([np.ones_like(n), n, n * (c + n / 2.0)])


def decode_features(b: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    b, ctx = np.asarray(b, float), np.asarray(ctx, float)
    return np.column_stack([np.ones_like(b), b, b * ctx])


@dataclass(frozen=True)
class MeasuredFit:
    """Fitted coefficients (seconds): prefill (a0, a1, a2) and decode (b0, b1, b2)."""
    prefill_coef: tuple[float, float, float]
    decode_coef: tuple[float, float, float]

    def prefill_s(self, new_tokens: float, context_tokens: float) -> float:
        a0, a1, a2 = self.prefill_coef
        return a0 + a1 * new_tokens + a2 * new_tokens * (context_tokens + new_tokens / 2.0)

    def decode_s(self, batch: float, mean_context: float) -> float:
        b0, b1, b2 = self.decode_coef
        return b0 + b1 * batch + b2 * batch * mean_context

    def to_json(self) -> dict[str, Any]:
        return {"prefill_s": "a0 + a1*N + a2*N*(C + N/2)", "a": list(self.prefill_coef),
                "decode_step_s": "b0 + b1*B + b2*B*L", "b": list(self.decode_coef)}


def fit(prefill: pd.DataFrame, decode: pd.DataFrame) -> MeasuredFit:
    """Fit both models to the measured tables (columns PREFILL_COLUMNS / DECODE_COLUMNS)."""
    a = _nnls_rel(prefill_features(prefill["new_tokens"], prefill["context_tokens"]), prefill["time_s"].to_numpy(float))
    b = _nnls_rel(decode_features(decode["batch_size"], decode["context_tokens"]), decode["step_s"].to_numpy(float))
    return MeasuredFit(tuple(float(x) for x in a), tuple(float(x) for x in b))  # type: ignore[arg-type]


def point_errors(f: MeasuredFit, prefill: pd.DataFrame, decode: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tables with `fit_s` and `error` ((fit - measured) / measured) per grid point."""
    p = prefill.copy()
    p["fit_s"] = [f.prefill_s(n, c) for n, c in zip(p["new_tokens"], p["context_tokens"])]
    p["error"] = p["fit_s"] / p["time_s"] - 1.0
    d = decode.copy()
    d["fit_s"] = [f.decode_s(b, c) for b, c in zip(d["batch_size"], d["context_tokens"])]
    d["error"] = d["fit_s"] / d["step_s"] - 1.0
    return p, d


def _read_csv(path: Path, columns: Sequence[str], min_rows: int = 3) -> pd.DataFrame:
    return read_table(path, columns, min_rows=min_rows, error=MeasuredProfileError)


def read_meta(folder: str | Path) -> dict[str, Any]:
    """profile.json of a measured profile directory (one-line error if missing or broken)."""
    path = Path(folder) / "profile.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MeasuredProfileError(f"{path}: not a measured profile (no profile.json; make one with "
                                   "`evolve profile --server URL --out DIR`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MeasuredProfileError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != PROFILE_FORMAT:
        raise MeasuredProfileError(f"{path}: field 'format' must be '{PROFILE_FORMAT}'")
    return meta


def read_tables(folder: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = Path(folder)
    return _read_csv(folder / "prefill.csv", PREFILL_COLUMNS), _read_csv(folder / "decode.csv", DECODE_COLUMNS)


def read_wake(folder: str | Path) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """idle.csv's wake-up curve: (engine idle s, extra s of the first step after it), starting at
    (0, 0), made non-decreasing (a longer idle period cannot make the next step cheaper; the
    points scatter by a few tenths of a millisecond). None if the profile has no idle table."""
    path = Path(folder) / "idle.csv"
    if not path.exists():
        return None
    df = _read_csv(path, IDLE_COLUMNS, min_rows=1)
    df = df.sort_values("engine_idle_s")
    xs = [0.0, *df["engine_idle_s"].astype(float)]
    ys = np.maximum.accumulate([0.0, *df["wake_s"].astype(float)])
    return tuple(xs), tuple(float(y) for y in ys)


class MeasuredPerf:
    """The simulator's step timer (instance.StepTimer) from a measured profile."""

    source = "measured"

    def __init__(self, fitted: MeasuredFit, kv_bytes_per_token: int, tp: int, host_link_gbs: float,
                 folder: Path | None = None,
                 wake: tuple[Sequence[float], Sequence[float]] | None = None) -> None:
        self.fit = fitted
        self.wake = wake
        self.folder = folder
        self.parts = {"prefill": "measured", "decode": "measured"}
        self._kv_bytes = kv_bytes_per_token
        self._tp = tp
        self._host_bps = host_link_gbs * 1e9
        a0, self._a1, self._a2 = fitted.prefill_coef
        b0, self._b1, self._b2 = fitted.decode_coef
        self._b0 = b0
        self._mixed0 = max(a0, b0)
        self._a0 = a0

    def step_time(self, prefills: Sequence[tuple[int, int]], n_decode: int, decode_kv_sum: int) -> float:
        if not prefills:
            if n_decode <= 0:
                return 0.0
            return self._b0 + self._b1 * n_decode + self._b2 * decode_kv_sum
        var = 0.0
        for n, c in prefills:
            var += self._a1 * n + self._a2 * n * (c + n / 2.0)
        if n_decode:
            return self._mixed0 + var + self._b1 * n_decode + self._b2 * decode_kv_sum
        return self._a0 + var

    def decode_steps_time(self, n_decode: int, decode_kv_sum: int, steps: int) -> float:
        """Sum of `steps` decode-only steps, every sequence's context growing by one per step
        (the decode model is linear in the total KV, so the sum is exact)."""
        if steps <= 0 or n_decode <= 0:
            return 0.0
        kv_total = steps * decode_kv_sum + n_decode * steps * (steps - 1) / 2.0
        return steps * (self._b0 + self._b1 * n_decode) + self._b2 * kv_total

    def wake_time(self, idle_s: float) -> float:
        """Extra time of the first step after the engine sat idle for `idle_s` (idle.csv: measured as
        the rise of a lone call's engine TTFT over the back-to-back one; linear between the measured
        points, flat beyond the last). On a CPU host the engine's code and data go cold while it
        waits; 0 without an idle table."""
        if self.wake is None or idle_s <= 0.0:
            return 0.0
        return float(np.interp(idle_s, self.wake[0], self.wake[1]))

    def kv_transfer_time(self, tokens: int) -> float:
        return tokens * self._kv_bytes / self._tp / self._host_bps


def resolve(folder: str | Path) -> Path:
    p = Path(folder).expanduser()
    if not p.is_dir():
        raise MeasuredProfileError(f"{p}: measured profile directory not found")
    return p.resolve()


@functools.lru_cache(maxsize=16)
def _load(folder: str, mtime_ns: int, kv_bytes: int, tp: int, host_gbs: float) -> MeasuredPerf:
    read_meta(folder)
    prefill, decode = read_tables(folder)
    return MeasuredPerf(fit(prefill, decode), kv_bytes, tp, host_gbs, Path(folder), read_wake(folder))


def load_measured(folder: str | Path, kv_bytes_per_token: int, tp: int = 1, host_link_gbs: float = 25.0) -> MeasuredPerf:
    """The measured step timer of a profile directory (cached; reloaded when its tables change)."""
    p = resolve(folder)
    tables = [p / f for f in ("prefill.csv", "decode.csv", "idle.csv") if (p / f).exists()]
    mtime = max((t.stat().st_mtime_ns for t in tables), default=0)
    return _load(str(p), mtime, int(kv_bytes_per_token), int(tp), float(host_link_gbs))

