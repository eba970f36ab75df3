"""Fitness ratio and its two-stage (draw, program) bootstrap interval."""
import math

import numpy as np
import pytest

from evaluator.fitness import estimate, ratio


def one(seed, cand, draw=0):
    return [{draw: (seed, cand)}]


def test_parity_is_exactly_one_with_a_degenerate_interval():
    jct = [10.0, 20.0, 35.0, 5.0]
    e = estimate([{0: (jct, jct), 1: (jct, jct)}])
    assert (e.fitness, e.lo, e.hi) == (1.0, 1.0, 1.0) and not e.significant()


def test_uniform_speedup_gives_its_ratio():
    seed = [10.0, 20.0, 30.0]
    e = estimate(one(seed, [x * 0.8 for x in seed]))
    assert e.fitness == pytest.approx(1.25) and e.lo == pytest.approx(1.25) and e.hi == pytest.approx(1.25)
    assert e.score == e.lo and e.significant()


def test_interval_brackets_the_point_and_widens_with_noise():
    rng = np.random.default_rng(1)
    seed = rng.uniform(50, 500, size=40)
    mild = seed * rng.normal(0.95, 0.01, size=40)
    noisy = seed * rng.normal(0.95, 0.2, size=40)
    e1, e2 = estimate(one(seed, mild)), estimate(one(seed, noisy))
    assert e1.lo <= e1.fitness <= e1.hi and e2.lo <= e2.fitness <= e2.hi
    assert (e2.hi - e2.lo) > 3 * (e1.hi - e1.lo)
    assert e1.lo > 1.0          # a consistent 5% gain is distinguishable from noise


def test_draw_to_draw_variation_widens_the_interval():
    """A gain on one draw and a loss on another: pooled pairs alone would look tight; the
    two-stage bootstrap must show that the gain does not hold."""
    rng = np.random.default_rng(2)
    seeds = {d: rng.uniform(100, 200, size=30) for d in range(3)}
    consistent = {d: (seeds[d], seeds[d] / 1.02) for d in range(3)}
    mixed = {0: (seeds[0], seeds[0] / 1.08), 1: (seeds[1], seeds[1] / 0.99), 2: (seeds[2], seeds[2] / 0.99)}
    c, m = estimate([consistent]), estimate([mixed])
    assert c.lo > 1.0
    assert m.fitness > 1.0 and m.lo < 1.0 < m.hi      # the mean is up, but not on every draw
    assert m.per_draw["0"] == pytest.approx(1.08) and m.per_draw["1"] == pytest.approx(0.99)
    assert m.draws == [0, 1, 2]


def test_several_cells_combine_by_geometric_mean():
    a = {0: ([10.0, 10.0], [5.0, 5.0])}     # ratio 2
    b = {0: ([10.0, 10.0], [20.0, 20.0])}   # ratio 0.5
    e = estimate([a, b], cell_names=["a", "b"])
    assert e.fitness == pytest.approx(1.0)
    assert e.per_cell == {"a": pytest.approx(2.0), "b": pytest.approx(0.5)}
    assert ratio(*a[0]) == 2.0


def test_mismatched_programs_are_rejected():
    with pytest.raises(ValueError, match="different programs"):
        estimate(one([1.0, 2.0], [1.0]))


def test_interval_is_reproducible_and_level_widens_it():
    seed = [3.0, 7.0, 11.0, 2.0, 9.0]
    cand = [2.5, 7.5, 10.0, 2.2, 8.0]
    assert estimate(one(seed, cand)) == estimate(one(seed, cand))
    e95, e99 = estimate(one(seed, cand)), estimate(one(seed, cand), level=0.99)
    assert not math.isnan(e95.lo) and e99.lo <= e95.lo and e99.hi >= e95.hi
