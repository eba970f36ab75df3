"""Fitness = seed mean JCT / candidate mean JCT, with a paired bootstrap interval.

Both policies run on the same workload seeds, so program i of seed s is the same program
under both; resampling those (seed, program) pairs with replacement shows how much of a
gain comes from a few programs (noise) and how much is consistent (signal).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20240611  # fixed: the interval is part of a candidate's reproducible record


def ratio(seed_jct: Sequence[float], cand_jct: Sequence[float]) -> float:
    """seed mean / candidate mean over paired per-program JCTs (1.0 = parity)."""
    s, c = float(np.mean(seed_jct)), float(np.mean(cand_jct))
    if c <= 0 or not math.isfinite(c):
        return 0.0
    return s / c


def paired_bootstrap(pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
                     level: float = 0.95, samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float, float]:
    """Fitness and its bootstrap interval over several cells.

    `pairs` holds, per cell, (seed JCTs, candidate JCTs) concatenated over workload seeds in
    the same order. The fitness of several cells is the geometric mean of their ratios; each
    bootstrap replicate resamples programs within every cell independently.
    """
    if not pairs:
        raise ValueError("no cells to score")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    logs = np.zeros(samples)
    point = 0.0
    for seed_jct, cand_jct in pairs:
        s = np.asarray(seed_jct, dtype=float)
        c = np.asarray(cand_jct, dtype=float)
        if s.shape != c.shape or s.size == 0:
            raise ValueError(f"seed and candidate ran different programs ({s.size} vs {c.size} JCTs)")
        point += math.log(max(ratio(s, c), 1e-300))
        idx = rng.integers(0, s.size, size=(samples, s.size))
        reps = s[idx].mean(axis=1) / np.maximum(c[idx].mean(axis=1), 1e-300)
        logs += np.log(np.maximum(reps, 1e-300))
    n = len(pairs)
    fit = math.exp(point / n)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.exp(logs / n), [alpha, 1.0 - alpha])
    return fit, float(lo), float(hi)
