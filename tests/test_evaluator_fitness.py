"""Fitness ratio and its paired bootstrap interval."""
import math

import numpy as np
import pytest

from evaluator.fitness import paired_bootstrap, ratio


def test_parity_is_exactly_one_with_a_degenerate_interval():
    jct = [10.0, 20.0, 35.0, 5.0]
    assert paired_bootstrap([(jct, jct)]) == (1.0, 1.0, 1.0)


def test_uniform_speedup_gives_its_ratio():
    seed = [10.0, 20.0, 30.0]
    cand = [x * 0.8 for x in seed]
    f, lo, hi = paired_bootstrap([(seed, cand)])
    assert f == pytest.approx(1.25)
    assert lo == pytest.approx(1.25) and hi == pytest.approx(1.25)


def test_interval_brackets_the_point_and_widens_with_noise():
    rng = np.random.default_rng(1)
    seed = rng.uniform(50, 500, size=40)
    mild = seed * rng.normal(0.95, 0.01, size=40)
    noisy = seed * rng.normal(0.95, 0.2, size=40)
    f1, lo1, hi1 = paired_bootstrap([(seed, mild)])
    f2, lo2, hi2 = paired_bootstrap([(seed, noisy)])
    assert lo1 <= f1 <= hi1 and lo2 <= f2 <= hi2
    assert (hi2 - lo2) > 3 * (hi1 - lo1)
    assert lo1 > 1.0          # a consistent 5% gain is distinguishable from noise


def test_several_cells_combine_by_geometric_mean():
    a = ([10.0, 10.0], [5.0, 5.0])     # ratio 2
    b = ([10.0, 10.0], [20.0, 20.0])   # ratio 0.5
    f, lo, hi = paired_bootstrap([a, b])
    assert f == pytest.approx(1.0)
    assert ratio(*a) == 2.0


def test_mismatched_programs_are_rejected():
    with pytest.raises(ValueError, match="different programs"):
        paired_bootstrap([([1.0, 2.0], [1.0])])


def test_interval_is_reproducible():
    seed = [3.0, 7.0, 11.0, 2.0, 9.0]
    cand = [2.5, 7.5, 10.0, 2.2, 8.0]
    assert paired_bootstrap([(seed, cand)]) == paired_bootstrap([(seed, cand)])
    assert not math.isnan(paired_bootstrap([(seed, cand)])[1])
