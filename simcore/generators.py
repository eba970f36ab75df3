"""Parametric, seeded generators of SWE-bench-like and BFCL-like agent programs.

All parameters live in configs/workloads/generators.yaml, each with its source. The
engine calls `generate(kind, n, seed)` for cells whose workload kind is swe or bfcl.

Determinism and common random numbers: program i draws its numbers from its own streams,
seeded by (seed, family, i) and by (seed, family, i // strata), so the first n programs of a
larger draw equal a smaller draw, and the kinds "swe" and "swe-tracelab" produce the same
programs except for the tool tail.

The one quantity that decides most of a workload's volume, the size of each program (calls
for SWE, the BFCL record drawn), is taken at stratified quantiles: every block of `strata`
consecutive programs holds exactly one quantile from each of `strata` equal slices of
(0, 1), in a seeded order, jittered inside its slice. The total context of a SWE workload
grows with the square of the call counts, so with independent draws the 50-program total
would have a 19 % standard deviation around the published 38.7 M tokens; one draw per
slice holds it to 2 % while any single program is still a random draw.

Order: the paper's smaller cells are prefixes of its 50-program trace, which starts with
short programs (configs/workloads/generators.yaml, `short_first`); `_order` moves whole
programs within a block, so a block is the same programs in any order.
"""
from __future__ import annotations

import functools
import math
import zlib
from pathlib import Path
from statistics import NormalDist

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simcore.config import load_yaml
from simcore.workload import Call, Program, WorkloadError

from .packaged import configs_dir

_PHI_FRAC = (math.sqrt(5.0) - 1.0) / 2.0  # golden-ratio step of the Weyl sequence

_STD_NORMAL = NormalDist()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogNormal(_Strict):
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: float = Field(ge=0)
    max: float = Field(gt=0)


class Duration(_Strict):
    median_s: float = Field(gt=0)
    sigma: float = Field(ge=0)


class ToolSpec(Duration):
    p: float = Field(ge=0, le=1)


class LongTail(_Strict):
    p: float = Field(ge=0, le=1)
    min_s: float = Field(ge=0)
    mean_excess_s: float = Field(ge=0)


class ShortFirst(_Strict):
    """The first `programs` of each block take their size from the lowest `of_strata` slices
    (a trace whose first programs are short ones; 0 programs = no such order)."""
    programs: int = Field(ge=0)
    of_strata: int = Field(gt=0)


class SweParams(_Strict):
    description: str = ""
    strata: int = Field(gt=0)
    short_first: ShortFirst = ShortFirst(programs=0, of_strata=1)
    calls: LogNormal
    initial_prompt_tokens: LogNormal
    output_tokens: LogNormal
    observation_tokens: LogNormal
    context_cap_tokens: int = Field(gt=0)
    tools: dict[str, ToolSpec]
    long_tail: LongTail

    @model_validator(mode="after")
    def _short_first_fits(self) -> "SweParams":
        sf = self.short_first
        if not sf.programs <= sf.of_strata <= self.strata:
            raise ValueError(f"short_first needs programs <= of_strata <= strata ({self.strata}), "
                             f"got programs={sf.programs}, of_strata={sf.of_strata}")
        return self


class BfclParams(_Strict):
    description: str = ""
    strata: int = Field(gt=0)
    structure_file: str
    initial_prompt_tokens: LogNormal
    output_tokens: LogNormal
    result_tokens: LogNormal
    tool_s: Duration
    turn_gap_s: Duration


# kind -> (parameter model, family). The family seeds the random streams, so kinds of one
# family share programs (common random numbers).
_KINDS: dict[str, tuple[type[_Strict], str]] = {
    "swe": (SweParams, "swe"),
    "swe-tracelab": (SweParams, "swe"),
    "bfcl": (BfclParams, "bfcl"),
}
KNOWN_KINDS = tuple(_KINDS)


def _config_dir() -> Path:
    return configs_dir() / "workloads"


@functools.lru_cache(maxsize=8)
def load_params(kind: str, config_path: str | None = None) -> SweParams | BfclParams:
    """Validated parameters of one generator kind (one-line WorkloadError if broken)."""
    if kind not in _KINDS:
        raise WorkloadError(f"unknown workload kind '{kind}'; known kinds: {', '.join(KNOWN_KINDS)}")
    path = Path(config_path) if config_path else _config_dir() / "generators.yaml"
    raw = load_yaml(path, WorkloadError) or {}
    if not isinstance(raw, dict) or kind not in raw:
        raise WorkloadError(f"{path}: no parameters for workload kind '{kind}'")
    model = _KINDS[kind][0]
    try:
        params = model(**(raw[kind] or {}))
    except (ValidationError, TypeError) as e:
        if isinstance(e, ValidationError):
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "(root)"
            raise WorkloadError(f"{path}: {kind}.{loc}: {err['msg']}") from None
        raise WorkloadError(f"{path}: {kind}: {e}") from None
    if isinstance(params, SweParams):
        total = sum(t.p for t in params.tools.values())
        if not params.tools or abs(total - 1.0) > 1e-6:
            raise WorkloadError(f"{path}: {kind}.tools: shares p must sum to 1, got {total:g}")
    return params


@functools.lru_cache(maxsize=4)
def _bfcl_records(path: str) -> tuple[tuple[tuple[int, tuple[str, ...]], ...], ...]:
    """Records as turns of (user tokens, function names), sorted by call count (stable)."""
    p = Path(path)
    raw = load_yaml(p, WorkloadError) or {}
    recs = raw.get("records") if isinstance(raw, dict) else None
    if not isinstance(recs, list) or not recs:
        raise WorkloadError(f"{p}: field 'records' must be a non-empty list")
    out = []
    for idx, rec in enumerate(recs):
        turns = []
        try:
            for part in str(rec).split("|"):
                utok, _, names = part.partition(":")
                turns.append((int(utok), tuple(x for x in names.split(",") if x)))
        except ValueError:
            raise WorkloadError(f"{p}: records[{idx}]: expected 'U:f1,f2|U:...', got {rec!r}") from None
        if not any(names for _, names in turns):
            raise WorkloadError(f"{p}: records[{idx}]: a program needs at least one call")
        out.append(tuple(turns))
    # Sorting by size makes a quantile u pick a program of the u-th size quantile.
    order = sorted(range(len(out)), key=lambda i: (sum(len(n) for _, n in out[i]), i))
    return tuple(out[i] for i in order)


def _block(seed: int, family: str, block: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Block b's slice per position (a permutation of range(block)) and jitter per position."""
    rng = np.random.default_rng([seed, _tag(family), 0x57A7, b])
    weyl = np.mod(rng.random() + np.arange(block) * _PHI_FRAC, 1.0)
    slot = np.argsort(np.argsort(weyl, kind="stable"), kind="stable")
    return slot, rng.random(block)


def _quantiles(n: int, seed: int, family: str, block: int) -> np.ndarray:
    """Stratified quantiles: each block of `block` programs takes one point in each of
    `block` equal slices of (0, 1), jittered inside its slice. The slices are visited in the
    rank order of a golden-ratio (Weyl) sequence from a seeded start, so every prefix of a
    block (a 30-program cell out of 50) is itself spread evenly over (0, 1)."""
    out = np.empty(n)
    for b in range(-(-n // block)):
        slot, jitter = _block(seed, family, block, b)
        lo = b * block
        m = min(block, n - lo)
        out[lo:lo + m] = (slot[:m] + jitter[:m]) / block
    return np.clip(out, 1e-9, 1.0 - 1e-9)


def _order(n: int, seed: int, family: str, block: int, short_first: ShortFirst | None) -> list[int]:
    """Which draw sits at each of the first n positions. Unordered: draw i at position i.
    With short_first, each block's first `programs` positions take the block's first draws
    (in draw order) whose size slice is below `of_strata`, and the rest follow in draw order:
    the block is the same programs, reordered, so only shorter prefixes change."""
    if short_first is None or not short_first.programs:
        return list(range(n))
    out: list[int] = []
    for b in range(-(-n // block)):
        slot, _ = _block(seed, family, block, b)
        front = [i for i in range(block) if slot[i] < short_first.of_strata][:short_first.programs]
        taken = set(front)
        out += [b * block + i for i in front + [i for i in range(block) if i not in taken]]
    return out[:n]


def _tag(family: str) -> int:
    return zlib.crc32(family.encode())


def _lognormal(rng: np.random.Generator, d: LogNormal, size: int | None = None) -> np.ndarray:
    x = d.median * np.exp(d.sigma * rng.standard_normal(size))
    return np.clip(np.rint(x), d.min, d.max)


def _swe_program(i: int, u: float, seed: int, kind: str, p: SweParams, position: int | None = None) -> Program:
    rng = np.random.default_rng([seed, _tag("swe"), i])
    c = p.calls
    n = int(np.clip(round(c.median * math.exp(c.sigma * _STD_NORMAL.inv_cdf(u))), c.min, c.max))
    # Draw every stream at its full size in a fixed order, whatever the parameters, so the
    # kinds of the family stay aligned call by call.
    p0 = int(_lognormal(rng, p.initial_prompt_tokens))
    outs = _lognormal(rng, p.output_tokens, n).astype(int)
    obs = _lognormal(rng, p.observation_tokens, n).astype(int)
    names = list(p.tools)
    shares = np.array([p.tools[k].p for k in names])
    which = rng.choice(len(names), size=n, p=shares / shares.sum())
    z = rng.standard_normal(n)
    tail_u = rng.random(n)
    tail_x = rng.exponential(1.0, n)
    cap = p.context_cap_tokens
    calls = []
    prompt = min(p0, cap)
    for k in range(n):
        last = k == n - 1
        if last:
            calls.append(Call(prompt, int(outs[k])))
            break
        spec = p.tools[names[which[k]]]
        dur = spec.median_s * math.exp(spec.sigma * z[k])
        if tail_u[k] < p.long_tail.p:
            dur = p.long_tail.min_s + p.long_tail.mean_excess_s * tail_x[k]
        else:
            # The short component stays below the tail threshold it is contrasted with.
            dur = min(dur, p.long_tail.min_s) if p.long_tail.p > 0 else dur
        calls.append(Call(prompt, int(outs[k]), names[which[k]], float(dur)))
        prompt = min(cap, prompt + int(outs[k]) + int(obs[k]))
    pos = i if position is None else position
    meta = {"generator": kind, "seed": seed, "index": pos, "draw": i}
    return Program(f"swe-{pos:04d}", tuple(calls), meta)


def _bfcl_program(i: int, u: float, seed: int, kind: str, p: BfclParams, records) -> Program:
    rng = np.random.default_rng([seed, _tag("bfcl"), i])
    rec = records[min(int(u * len(records)), len(records) - 1)]
    flat = [(t, name) for t, (_, names) in enumerate(rec) for name in names]
    n = len(flat)
    p0 = int(_lognormal(rng, p.initial_prompt_tokens))
    outs = _lognormal(rng, p.output_tokens, n).astype(int)
    res = _lognormal(rng, p.result_tokens, n).astype(int)
    z_tool = rng.standard_normal(n)
    z_turn = rng.standard_normal(n)
    first_turn = flat[0][0]
    prompt = p0 + sum(utok for utok, _ in rec[: first_turn + 1])
    calls = []
    for k, (turn, name) in enumerate(flat):
        if k == n - 1:
            calls.append(Call(prompt, int(outs[k])))
            break
        next_turn = flat[k + 1][0]
        dur = p.tool_s.median_s * math.exp(p.tool_s.sigma * z_tool[k])
        grow = int(outs[k]) + int(res[k])
        if next_turn != turn:
            dur += p.turn_gap_s.median_s * math.exp(p.turn_gap_s.sigma * z_turn[k])
            # User messages of the next turn (and of any call-less turn in between).
            grow += sum(utok for utok, _ in rec[turn + 1: next_turn + 1])
        calls.append(Call(prompt, int(outs[k]), name, float(dur)))
        prompt += grow
    meta = {"generator": kind, "seed": seed, "index": i, "turns": len(rec)}
    return Program(f"bfcl-{i:04d}", tuple(calls), meta)


def generate(kind: str, n: int, seed: int, config_path: str | Path | None = None) -> list[Program]:
    """n programs of a built-in workload kind, deterministic in (kind, n, seed).

    Raises WorkloadError for an unknown kind (naming the known ones) or a bad config.
    """
    if kind not in _KINDS:
        raise WorkloadError(f"unknown workload kind '{kind}'; known kinds: {', '.join(KNOWN_KINDS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise WorkloadError(f"number of programs must be a positive integer, got {n!r}")
    cfg = str(config_path) if config_path is not None else None
    params = load_params(kind, cfg)
    family = _KINDS[kind][1]
    if isinstance(params, SweParams):
        order = _order(n, seed, family, params.strata, params.short_first)
        us = _quantiles(max(order) + 1, seed, family, params.strata)
        return [_swe_program(j, float(us[j]), seed, kind, params, k) for k, j in enumerate(order)]
    us = _quantiles(n, seed, family, params.strata)
    base = Path(cfg).parent if cfg else _config_dir()
    records = _bfcl_records(str(base / params.structure_file))
    return [_bfcl_program(i, float(us[i]), seed, kind, params, records) for i in range(n)]
