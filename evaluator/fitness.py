"""Fitness = seed mean JCT / candidate mean JCT, with a two-stage (draw, program) bootstrap.

Both policies run on the same workload and arrival draws, so program i of draw d is the
same program under both. A policy's effect differs from draw to draw (another arrival
order, other programs), and programs within one draw share one queue, so they are not
independent samples. The interval therefore resamples at both levels: each replicate
draws the workload draws with replacement, then programs within every chosen draw with
replacement, and takes the ratio of mean JCTs over the resampled pairs. A gain that holds
on one draw and vanishes on another gets a wide interval; resampling pooled pairs alone
(one level) would hide exactly that.

The search ranks candidates by the interval's lower bound (`score`): a candidate counts
as better than the seed only where its interval lies above 1.0.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20240611  # fixed: the interval is part of a candidate's reproducible record
LEVEL = 0.95

# per cell: {draw: (seed JCTs, candidate JCTs)} with program i at index i in both lists
CellPairs = Mapping[int, tuple[Sequence[float], Sequence[float]]]


class FitnessEstimate(BaseModel):
    """Point fitness, its bootstrap interval and the fitness of every draw (target cell)."""
    model_config = ConfigDict(frozen=True)

    fitness: float
    lo: float
    hi: float
    level: float = LEVEL
    draws: list[int]
    per_draw: dict[str, float]           # draw -> fitness on that draw alone (target cell)
    per_cell: dict[str, float] = {}      # cell -> pooled fitness (when scored on several cells)

    @property
    def score(self) -> float:
        """The ranking key: the lower bound of the interval."""
        return self.lo

    def significant(self) -> bool:
        """True when the whole interval lies above parity."""
        return self.lo > 1.0


def ratio(seed_jct: Sequence[float], cand_jct: Sequence[float]) -> float:
    """seed mean / candidate mean over paired per-program JCTs (1.0 = parity)."""
    s, c = float(np.mean(seed_jct)), float(np.mean(cand_jct))
    if c <= 0 or not math.isfinite(c):
        return 0.0
    return s / c


def _cell_arrays(pairs: CellPairs) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    draws = sorted(pairs)
    seeds, cands = [], []
    for d in draws:
        s = np.asarray(pairs[d][0], dtype=float)
        c = np.asarray(pairs[d][1], dtype=float)
        if s.shape != c.shape or s.size == 0:
            raise ValueError(f"draw {d}: seed and candidate ran different programs ({s.size} vs {c.size} JCTs)")
        seeds.append(s)
        cands.append(c)
    return draws, seeds, cands


def _replicates(seeds: list[np.ndarray], cands: list[np.ndarray], rng: np.random.Generator,
                samples: int) -> np.ndarray:
    """Two-stage bootstrap replicates of sum(seed) / sum(candidate) for one cell."""
    k = len(seeds)
    num = np.zeros(samples)
    den = np.zeros(samples)
    picks = rng.integers(0, k, size=(samples, k))          # stage 1: draws with replacement
    for d in range(k):
        n = seeds[d].size
        idx = rng.integers(0, n, size=(samples, n))        # stage 2: programs within draw d
        s_sum = seeds[d][idx].sum(axis=1)
        c_sum = cands[d][idx].sum(axis=1)
        times = (picks == d).sum(axis=1)                   # how often draw d was picked
        num += times * s_sum
        den += times * c_sum
    return num / np.maximum(den, 1e-300)


def estimate(cells: Sequence[CellPairs], level: float = LEVEL,
             samples: int = BOOTSTRAP_SAMPLES, cell_names: Sequence[str] | None = None) -> FitnessEstimate:
    """Fitness over one or more cells (geometric mean of the cells' ratios) and its interval.

    The first cell is the target: its per-draw fitness is reported. Each cell is
    resampled independently in every replicate.
    """
    if not cells:
        raise ValueError("no cells to score")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    logs = np.zeros(samples)
    point = 0.0
    per_cell: dict[str, float] = {}
    per_draw: dict[str, float] = {}
    draws0: list[int] = []
    for i, pairs in enumerate(cells):
        draws, seeds, cands = _cell_arrays(pairs)
        r = float(sum(s.sum() for s in seeds) / max(sum(c.sum() for c in cands), 1e-300))
        point += math.log(max(r, 1e-300))
        logs += np.log(np.maximum(_replicates(seeds, cands, rng, samples), 1e-300))
        if cell_names is not None:
            per_cell[cell_names[i]] = r
        if i == 0:
            draws0 = draws
            per_draw = {str(d): ratio(s, c) for d, s, c in zip(draws, seeds, cands)}
    n = len(cells)
    fit = math.exp(point / n)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.exp(logs / n), [alpha, 1.0 - alpha])
    # an exact tie (a policy that changes no decision) has no spread; keep the point inside
    lo, hi = min(float(lo), fit), max(float(hi), fit)
    return FitnessEstimate(fitness=fit, lo=lo, hi=hi, level=level, draws=draws0, per_draw=per_draw,
                           per_cell=per_cell if n > 1 else {})
