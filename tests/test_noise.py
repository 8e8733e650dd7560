"""Seed-noise maths (nas.noise) and noise-aware early stopping, on fabricated replicates
with known answers."""
import math

import numpy as np
import pytest

from nas.noise import (
    beyond_noise, kendall_tau, mean_se, p_front, permutation_floor, permutation_test, pooled_variance,
    tied_neighbours,
)
from runners.sweep.stopping import ParetoHalving

MAXQ_MINC = ["maximize", "minimize"]  # (quality, cost)


def test_mean_se_and_pooled_variance():
    assert mean_se([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0 / math.sqrt(3)))
    assert math.isnan(mean_se([4.0])[1])
    # groups (1, 3) and (2, 4, 6): SS 2 + 8 over 1 + 2 degrees of freedom
    assert pooled_variance([[1, 3], [2, 4, 6], [9]]) == pytest.approx(10 / 3)
    assert math.isnan(pooled_variance([[1], [2]]))


def test_p_front_certain_cases():
    cheap_bad = np.array([[0.1, 1.0]] * 3)
    cheap_good = np.array([[0.9, 1.0], [0.91, 1.0], [0.89, 1.0]])
    dear_better = np.array([[0.95, 2.0], [0.96, 2.0], [0.97, 2.0]])
    p = p_front([cheap_bad, cheap_good, dear_better], MAXQ_MINC, draws=300)
    assert p.tolist() == [0.0, 1.0, 1.0]


def test_p_front_matches_the_exact_bootstrap_probability():
    # A: cost 1, quality 0.5 (one replicate, fixed). B: cost 2, replicates 0.4 and 0.6: a
    # bootstrap mean is 0.4, 0.5, 0.6 with probability 1/4, 1/2, 1/4, and B is on the front
    # only when its mean beats A's 0.5 (a tie at higher cost is dominated): p = 1/4.
    a = np.array([[0.5, 1.0]])
    b = np.array([[0.4, 2.0], [0.6, 2.0]])
    p = p_front([a, b], MAXQ_MINC, draws=8000, seed=1)
    assert p[0] == 1.0
    assert p[1] == pytest.approx(0.25, abs=0.02)


def test_one_replicate_everywhere_gives_zero_or_one():
    p = p_front([np.array([[0.5, 1.0]]), np.array([[0.4, 2.0]])], MAXQ_MINC, draws=50)
    assert p.tolist() == [1.0, 0.0]


def test_beyond_noise_and_ties():
    assert beyond_noise(1.0, 0.1, 0.0, 0.1) is True  # 1.0 > 2 * 0.141
    assert beyond_noise(0.2, 0.1, 0.0, 0.1) is False
    assert beyond_noise(0.2, math.nan, 0.0, 0.1) is None
    assert tied_neighbours([0.5, 0.52, 0.9], [0.02, 0.02, 0.02]) == [True, False]


def _cells(effect, rng, contexts=2, levels=3, seeds=3):
    return [[rng.normal(effect * l, 1.0, seeds) for l in range(levels)] for _ in range(contexts)]


def test_permutation_test_finds_a_planted_effect_and_not_a_null_one():
    rng = np.random.default_rng(0)
    assert permutation_test(_cells(5.0, rng), permutations=2000) < 0.01
    nulls = [permutation_test(_cells(0.0, rng), permutations=400, seed=s) for s in range(20)]
    assert min(nulls) > 0.001 and np.mean(nulls) > 0.25  # uniform under the null: mean ≈ 0.5
    assert math.isnan(permutation_test([[[1.0, 2.0]]]))  # one level: nothing to test


def test_permutation_floor_is_the_exact_smallest_p():
    assert permutation_floor([[3, 3]]) == pytest.approx(2 / 20)  # C(6, 3) splits, 2 reach the max
    assert permutation_floor([[4, 4]]) == pytest.approx(2 / 70)
    assert permutation_floor([[3, 3], [3, 3]]) == pytest.approx(0.01)  # contexts multiply
    assert permutation_floor([[2, 3]]) == pytest.approx(1 / 10)  # unequal cells: no label swap
    assert permutation_floor([[3]]) == 1.0  # one level: nothing to test
    # the Monte Carlo test of a perfect split lands on the floor
    assert permutation_test([[[1, 2, 3], [10, 11, 12]]]) == pytest.approx(0.1, abs=0.02)


def test_kendall_tau():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))


def test_auto_margin_stops_only_beyond_two_standard_errors():
    stop = ParetoHalving(rungs=(10,), margin="auto")
    # a cheap trial with 3 replicates (spread: variance 0.01) and a dearer one
    for i, q in enumerate([0.70, 0.80, 0.90]):
        stop.record("cheap", 10, (1.0,), q, replicate=i)
    # "close" ends at mean 0.68 (0.12 worse than 0.80); pooled within-trial variance
    # (0.02 + 0.0072) / 4 = 0.0068, threshold 2 * sqrt(0.0068/3 + 0.0068/3) = 0.135
    for i, q in enumerate([0.74, 0.62, 0.68]):
        assert not stop.decide("close", 10, (2.0,), q, replicate=i)
    for i, q in enumerate([0.55, 0.60, 0.50]):  # 0.25 worse: beyond 2 s.e. from its first replicate
        last = stop.decide("far", 10, (2.0,), q, replicate=i)
    assert last
    # never stopped by a dearer trial, however much better it is
    assert not stop.decide("cheaper", 10, (0.5,), 0.1)


def test_auto_margin_never_stops_while_noise_is_unknown():
    stop = ParetoHalving(rungs=(10,), margin="auto")
    stop.record("a", 10, (1.0,), 0.99)
    assert not stop.decide("b", 10, (2.0,), 0.01)
    fixed = ParetoHalving(rungs=(10,), margin=0.02)
    fixed.record("a", 10, (1.0,), 0.99)
    assert fixed.decide("b", 10, (2.0,), 0.01)
