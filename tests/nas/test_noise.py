"""Seed-noise maths (nas.noise) against independent references: scipy (sem, ttest_rel,
ttest_ind, f_oneway, permutation_test, kendalltau), exact enumeration written here, and
simulations of the designs the shipped spaces use; plus noise-aware early stopping. Each
formula is pinned by a test that a plausible wrong formula fails (the mutations of issue #29
are named where they are caught)."""
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from nas.noise import (
    TIE_ALPHA, beyond_noise, compare, holm, kendall_tau, mean_se, p_front, p_text, permutation_floor,
    permutation_test, pooled_variance, seed_effect, t_sf, tau_ci, tied_neighbours,
)
from runners.sweep.stopping import ParetoHalving

MAXQ_MINC = ["maximize", "minimize"]  # (quality, cost)
ALPHA = 0.01


def test_mean_se_and_pooled_variance_match_scipy():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, 7)
    assert mean_se(x) == pytest.approx((x.mean(), stats.sem(x)))
    assert math.isnan(mean_se([4.0])[1])
    # groups (1, 3) and (2, 4, 6): SS 2 + 8 over 1 + 2 degrees of freedom
    assert pooled_variance([[1, 3], [2, 4, 6], [9]]) == pytest.approx(10 / 3)
    assert math.isnan(pooled_variance([[1], [2]]))


# ---- two candidates -------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_compare_is_scipys_paired_t_test_over_shared_seeds(n):
    rng = np.random.default_rng(n)
    seed_luck = rng.normal(0, 1, n)
    a, b = seed_luck + rng.normal(0.3, 0.2, n), seed_luck + rng.normal(0, 0.2, n)
    order = rng.permutation(n)  # replicates listed in another order: pairing is by seed, not position
    t = compare(a[order], b, seeds_a=order.tolist(), seeds_b=list(range(n)))
    ref = stats.ttest_rel(a, b)
    assert t.paired and t.n == n and "paired" in t.test
    assert t.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert t.diff / t.se == pytest.approx(ref.statistic, rel=1e-10)


@pytest.mark.parametrize("lo,hi,rel", [(0.5, 10, 1e-13), (10, 200, 1e-11), (200, 10_000, 2e-10)])
def test_t_sf_is_scipys_student_t_tail(lo, hi, rel):
    """compare's p without scipy.stats (issue #32: status does not import it): the t tail by
    the incomplete beta's continued fraction, against scipy's, including far tails."""
    rng = np.random.default_rng(int(lo))
    dof = rng.uniform(lo, hi, 3000)
    t = np.abs(rng.standard_cauchy(3000)) * rng.choice([0.01, 1.0, 10.0, 100.0], 3000)
    ref = stats.t.sf(t, dof)
    got = np.array([t_sf(float(x), float(d)) for x, d in zip(t, dof)])
    assert np.allclose(got, ref, rtol=rel, atol=1e-300)
    assert t_sf(0.0, 3) == 0.5 and t_sf(math.inf, 3) == 0.0 and t_sf(-1.0, 3) == pytest.approx(stats.t.sf(-1.0, 3))
    assert t_sf(40.0, 1) == pytest.approx(stats.t.sf(40.0, 1), rel=1e-13)  # the Cauchy tail


def test_compare_falls_back_to_welch_when_seeds_are_not_shared_and_says_so():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 5), rng.normal(1, 2, 4)
    ref = stats.ttest_ind(a, b, equal_var=False)
    for seeds_b in (None, [0, 1, 2, 3], [0, 1, 2, 3, 9][:4]):
        t = compare(a, b, seeds_a=[0, 1, 2, 3, 4], seeds_b=seeds_b)
        assert not t.paired and "Welch" in t.test and t.p == pytest.approx(ref.pvalue, rel=1e-10)
        # se is the hypotenuse of the two standard errors, not their sum (mutation: se_a + se_b)
        assert t.se == pytest.approx(math.hypot(stats.sem(a), stats.sem(b)))
    assert "seeds not shared" in compare(a, b, [0, 1, 2, 3, 4], [5, 6, 7, 8]).test
    assert math.isnan(compare([1.0], [2.0]).p)  # one replicate: noise unknown


def test_compare_at_zero_spread():
    assert compare([1, 2, 3], [0, 1, 2], [0, 1, 2], [0, 1, 2]).p == 0.0  # every seed 1 apart
    assert compare([1, 2, 3], [1, 2, 3], [0, 1, 2], [0, 1, 2]).p == 1.0


def _shared_seed_pairs(rng, n, shift_se, sims, seed_sd=2.0, resid_sd=1.0):
    """Two candidates × n seeds with a seed effect both share; the shift is ``shift_se``
    standard errors of the *unpaired* difference of means (what the old rule measured)."""
    se_unpaired = math.sqrt(2 * (seed_sd ** 2 + resid_sd ** 2) / n)
    luck = rng.normal(0, seed_sd, (sims, n))
    a = luck + rng.normal(0, resid_sd, (sims, n)) + shift_se * se_unpaired
    b = luck + rng.normal(0, resid_sd, (sims, n))
    return a, b


def test_paired_power_at_three_standard_errors_with_a_shared_seed_effect():
    """Two candidates × 5 seeds, a seed effect with 4× the residual variance, a shift of 3
    s.e.: the paired test finds it at p < 0.01 in ≥ 80% of runs, where treating the seeds as
    independent (Welch) does far less often."""
    rng = np.random.default_rng(0)
    a, b = _shared_seed_pairs(rng, 5, 3.0, 400)
    seeds = list(range(5))
    paired = np.mean([compare(x, y, seeds, seeds).p < ALPHA for x, y in zip(a, b)])
    welch = np.mean([compare(x, y).p < ALPHA for x, y in zip(a, b)])
    assert paired >= 0.80 and welch < 0.5


@pytest.mark.parametrize("n", [3, 5])
def test_the_ties_rule_has_its_stated_false_positive_rate(n):
    """The front's ≈: under the null, 'differs beyond seed noise' fires for TIE_ALPHA of the
    pairs (±3 binomial s.e. over 3000 pairs): paired over shared seeds with a seed effect,
    and Welch's on independent replicates (with a shared seed effect ignored, Welch's is
    conservative). The old 2-combined-s.e. rule fired for 8-12% at 3-5 seeds."""
    rng = np.random.default_rng(n)
    sims = 3000
    band = 3 * math.sqrt(TIE_ALPHA * (1 - TIE_ALPHA) / sims)
    a, b = _shared_seed_pairs(rng, n, 0.0, sims)
    seeds = list(range(n))
    assert abs(np.mean([compare(x, y, seeds, seeds).separated() for x, y in zip(a, b)]) - TIE_ALPHA) < band
    assert np.mean([compare(x, y).separated() for x, y in zip(a, b)]) < TIE_ALPHA + band
    a, b = _shared_seed_pairs(rng, n, 0.0, sims, seed_sd=0.0)
    welch = np.mean([compare(x, y).separated() for x, y in zip(a, b)])
    assert TIE_ALPHA / 2 < welch < TIE_ALPHA + band  # Welch's approximation errs slightly low at 3 seeds
    tests = [compare(a[0], b[0]), compare(a[1] + 100, b[1])]
    assert tied_neighbours(tests) == [tests[0].p >= TIE_ALPHA, False]


def test_beyond_noise_is_early_stoppings_margin():
    assert beyond_noise(1.0, 0.1, 0.0, 0.1) is True  # 1.0 > 2 * 0.141
    assert beyond_noise(0.2, 0.1, 0.0, 0.1) is False
    assert beyond_noise(0.2, math.nan, 0.0, 0.1) is None
    assert beyond_noise(0.35, 0.1, 0.0, 0.1) is True  # 2·hypot = 0.283 (mutations: Z = 3 → 0.424; sum → 0.4)
    assert beyond_noise(0.3, 0.1, 0.0, 0.1) is True


# ---- the probability of being on the front --------------------------------------------


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


def _exact_paired_p_front(reps, directions):
    """Every one of the n^n seed-index draws, each once: the paired bootstrap's exact answer."""
    from nas.pareto import pareto_front
    n = len(reps[0])
    hits = np.zeros(len(reps))
    for idx in itertools.product(range(n), repeat=n):
        means = np.stack([r[list(idx)].mean(0) for r in reps])
        hits[pareto_front(means, directions)] += 1
    return hits / n ** n


def test_p_front_is_paired_by_seed():
    """Two candidates whose seeds move them together: B is better than A on every seed by
    0.01 at a higher cost, while the seeds spread them by 0.3. Paired, B is on the front in
    every draw and A only by cost; unpaired, B would often look worse than A."""
    luck = np.array([0.0, 0.3, -0.3])
    a = np.stack([0.5 + luck, np.full(3, 1.0)], 1)
    b = np.stack([0.51 + luck, np.full(3, 2.0)], 1)
    c = np.stack([0.45 + luck[[2, 0, 1]], np.full(3, 3.0)], 1)  # its seeds listed in another order
    seeds = [[0, 1, 2], [0, 1, 2], [2, 0, 1]]
    paired = p_front([a, b, c], MAXQ_MINC, draws=4000, seed=0, seeds=seeds)
    exact = _exact_paired_p_front([a, b, c[[1, 2, 0]]], MAXQ_MINC)
    assert paired.tolist() == pytest.approx(exact.tolist(), abs=0.02)
    assert paired[1] == 1.0 and paired[2] == 0.0
    unpaired = p_front([a, b, c], MAXQ_MINC, draws=4000, seed=0)
    assert unpaired[1] < 0.8
    # seeds not shared by every candidate: the unpaired answer, not a wrong pairing
    assert p_front([a, b, c], MAXQ_MINC, draws=4000, seed=0, seeds=[[0, 1, 2], [0, 1, 2], [3, 4, 5]]).tolist() \
        == unpaired.tolist()


def test_one_replicate_everywhere_gives_zero_or_one():
    p = p_front([np.array([[0.5, 1.0]]), np.array([[0.4, 2.0]])], MAXQ_MINC, draws=50)
    assert p.tolist() == [1.0, 0.0]


# ---- the permutation test -------------------------------------------------------------


def _ss(groups):
    allv = np.concatenate(groups)
    return sum(len(g) * (np.mean(g) - allv.mean()) ** 2 for g in groups)


def _brute_unpaired(cells):
    """Every assignment of each context's values to its cells, counted one by one."""
    per_ctx = []
    for ctx in cells:
        flat = [v for cell in ctx for v in cell]
        sizes = [len(c) for c in ctx]
        stats_ = []
        for perm in set(itertools.permutations(range(len(flat)))):
            groups, at = [], 0
            for n in sizes:
                groups.append(sorted(perm[at:at + n]))
                at += n
            stats_.append((tuple(tuple(g) for g in groups), _ss([np.array([flat[i] for i in g]) for g in groups])))
        per_ctx.append(np.array([s for _, s in dict(stats_).items()]))
    total = np.zeros(1)
    for st in per_ctx:
        total = (total[:, None] + st[None, :]).ravel()
    obs = sum(_ss([np.array(c) for c in ctx]) for ctx in cells)
    return np.mean(total >= obs - 1e-9)


def _brute_paired(cells):
    """Every within-seed shuffle of the levels, in every context."""
    total = np.zeros(1)
    obs = 0.0
    for ctx in cells:
        y = np.array(ctx).T  # (S, L)
        S, L = y.shape
        obs += _ss(list(y.T))
        st = []
        for perms in itertools.product(list(itertools.permutations(range(L))), repeat=S):
            z = np.array([y[s][list(p)] for s, p in enumerate(perms)])
            st.append(_ss(list(z.T)))
        total = (total[:, None] + np.array(st)[None, :]).ravel()
    return np.mean(total >= obs - 1e-9)


def test_exact_unpaired_p_is_every_relabelling_counted():
    """Against a brute-force count written independently: within contexts only (mutation:
    shuffling across contexts changes it), the between-level sum of squares (mutation: the
    range of the means changes it), unequal cells included."""
    rng = np.random.default_rng(5)
    cells = [[list(rng.normal(0, 1, 3)), list(rng.normal(0.8, 1, 2))],
             [list(rng.normal(10, 1, 2)), list(rng.normal(10.5, 1, 2)), list(rng.normal(9, 1, 2))]]
    r = permutation_test(cells)
    assert r.exact and not r.paired
    assert r.p == pytest.approx(_brute_unpaired(cells), abs=1e-12)
    assert r.p > 0


def test_exact_unpaired_p_agrees_with_scipys_permutation_test():
    rng = np.random.default_rng(6)
    groups = [rng.normal(m, 1, 4) for m in (0.0, 1.0, 0.3)]
    r = permutation_test([[list(g) for g in groups]])
    ref = stats.permutation_test(groups, lambda *g: stats.f_oneway(*g).statistic, permutation_type="independent",
                                 n_resamples=np.inf, alternative="greater")
    assert r.p == pytest.approx(ref.pvalue, rel=1e-9)


def test_exact_paired_p_agrees_with_scipys_samples_permutation_and_brute_force():
    rng = np.random.default_rng(7)
    luck = rng.normal(0, 3, 6)
    a, b = luck + rng.normal(0.5, 0.5, 6), luck + rng.normal(0, 0.5, 6)
    seeds = [list(range(6))] * 2
    r = permutation_test([[list(a), list(b)]], [seeds], alpha=0.05)
    ref = stats.permutation_test((a, b), lambda x, y, axis=-1: np.abs(np.mean(x - y, axis=axis)),
                                 permutation_type="samples", n_resamples=np.inf, alternative="greater",
                                 vectorized=True)
    assert r.paired and r.exact and r.p == pytest.approx(ref.pvalue, rel=1e-9)
    rng = np.random.default_rng(8)
    cells = [[list(rng.normal(l * 0.4, 1, 3)) for l in range(3)] for _ in range(2)]
    r = permutation_test(cells, [[[0, 1, 2]] * 3] * 2, alpha=0.1)
    assert r.paired and r.exact and r.p == pytest.approx(_brute_paired(cells), abs=1e-12)


def test_the_perfect_split_at_the_floor_never_separates_on_any_rng_seed():
    """A 2×2 grid × 3 seeds with every level-b value above every level-a value: the exact p
    is the design's floor, 0.01 unpaired (and 4/64 paired), never below it, on every RNG seed."""
    cells = [[[0.1, 0.2, 0.3], [0.7, 0.8, 0.9]], [[0.15, 0.25, 0.2], [0.6, 0.75, 0.7]]]
    for s in range(50):
        r = permutation_test(cells, seed=s)
        assert r.exact and r.p == 0.01 == r.floor and not r.p < ALPHA
        r = permutation_test(cells, [[[0, 1, 2], [0, 1, 2]]] * 2, seed=s)
        assert not r.p_upper < ALPHA
    assert p_text(r.p, r.floor) == f"p ≤ {r.floor:.2g} (the design's floor)"


def test_permutation_floor_is_the_exact_smallest_p():
    assert permutation_floor([[3, 3]]) == 2 / 20  # C(6, 3) splits, 2 reach the max
    assert permutation_floor([[4, 4]]) == pytest.approx(2 / 70)
    assert permutation_floor([[3, 3], [3, 3]]) == 0.01  # contexts multiply (exactly: no rounding below α)
    assert permutation_floor([[2, 3]]) == pytest.approx(1 / 10)  # unequal cells: no label swap
    assert permutation_floor([[3]]) == 1.0  # one level: nothing to test
    assert permutation_floor([[5, 5]], paired=True) == 2 / 32  # sign flips of 5 pairs
    assert permutation_floor([[5, 5, 5]], paired=True) == pytest.approx(6 / 6 ** 5)


def test_monte_carlo_brackets_the_exact_p_and_decides_on_its_upper_end():
    rng = np.random.default_rng(9)
    cells = [[list(rng.normal(l * 0.5, 1, 5)) for l in range(3)] for _ in range(2)]
    seeds = [[list(range(5))] * 3] * 2  # 6^10 relabellings: exact as 6^5 sorted against 6^5
    mc = permutation_test(cells, seeds, alpha=0.05, exact_limit=1000)
    exact = permutation_test(cells, seeds)
    assert exact.relabellings == 6 ** 10
    assert not mc.exact and exact.exact
    assert mc.p <= mc.p_upper and abs(mc.p - exact.p) < 4 * math.sqrt(exact.p * (1 - exact.p) / mc.relabellings) + 1e-4
    # the observed relabelling is counted: p is never 0 (mutation: no +1)
    strong = [[list(l * 10 + rng.normal(0, 0.1, 5)) for l in range(3)] for _ in range(2)]
    r = permutation_test(strong, seeds, exact_limit=1000)
    assert not r.exact and r.p >= 1 / (r.relabellings + 1) and r.p_upper < ALPHA


@pytest.mark.parametrize("design", [
    pytest.param((2, 3, 5, True), id="quickstart-mixer-C3-L2-S5-paired"),
    pytest.param((1, 3, 5, True), id="quickstart-loop-C1-L3-S5-paired"),
    pytest.param((2, 2, 4, True), id="mixerloop-like-C2-L2-S4"),
    pytest.param((2, 2, 3, False), id="C2-L2-S3-unpaired"),
])
def test_null_separates_rate_is_at_most_alpha(design):
    """On the shipped spaces' designs, with a seed effect, no level effect: p < 0.01 in at
    most α of 400 runs plus 3 binomial standard errors (a function that returns 0.5 would
    pass this; the power tests below would not)."""
    contexts, levels, seeds, paired = design
    rng = np.random.default_rng(sum(design))
    sims, hits = 400, 0
    for _ in range(sims):
        luck = rng.normal(0, 1, seeds)
        cells = [[list(luck + rng.normal(0, 1, seeds)) for _ in range(levels)] for _ in range(contexts)]
        sd = [[list(range(seeds))] * levels] * contexts if paired else None
        hits += permutation_test(cells, sd).p_upper < ALPHA
    assert hits / sims <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / sims)


def test_a_planted_effect_separates_where_the_design_can():
    rng = np.random.default_rng(11)
    seeds = [[list(range(5))] * 3] * 2
    cells = [[list(rng.normal(l, 0.3, 5)) for l in range(3)] for _ in range(2)]
    assert permutation_test(cells, seeds).p_upper < ALPHA
    assert math.isnan(permutation_test([[[1.0, 2.0]]]).p)  # one level: nothing to test


def test_paired_is_chosen_by_the_design_not_the_values():
    rng = np.random.default_rng(12)
    two_by_five = [[list(rng.normal(0, 1, 5)), list(rng.normal(0, 1, 5))]]
    r = permutation_test(two_by_five, [[list(range(5))] * 2])
    # 2^5 sign flips cannot go below 1/16, C(10, 5) splits can reach 2/252 < 0.01: unpaired, said so
    assert not r.paired and "cannot go below p = 0.062" in r.test
    r = permutation_test(two_by_five * 3, [[list(range(5))] * 2] * 3)
    assert r.paired and "paired by seed" in r.test
    r = permutation_test(two_by_five, [[list(range(5)), [0, 1, 2, 3, 9]]])
    assert not r.paired and "seeds not shared" in r.test


# ---- multiplicity, the seed effect, rank agreement --------------------------------------


def test_holm_matches_the_step_down_definition():
    ps = [0.01, 0.04, 0.03, 0.005, math.nan]
    # sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → running max
    assert holm(ps)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(holm(ps)[4])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_seed_effect_share_and_test():
    rng = np.random.default_rng(13)
    luck = rng.normal(0, 2, 6)
    values = [list(luck + rng.normal(m, 0.5, 6)) for m in (0, 1, 2)]
    se = seed_effect(values, [list(range(6))] * 3)
    # the two-way ANOVA by hand: F = MS_seed / MS_residual
    y = np.array(values)
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    f = 3 * ((y.mean(0) - y.mean()) ** 2).sum() / 5 / ((resid ** 2).sum() / 10)
    assert se.p == pytest.approx(stats.f.sf(f, 5, 10)) and se.p < 0.01 and se.share > 0.7
    assert seed_effect(values, [list(range(6)), list(range(6)), list(range(1, 7))]) is None


def test_kendall_tau_and_its_interval_and_exact_p():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))
    rng = np.random.default_rng(14)
    x, y = rng.normal(0, 1, 9), rng.normal(0, 1, 9)
    y[[1, 4]] = y[0]  # ties: τ-b
    assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
    a = rng.normal(0, 1, (7, 1))
    b = a + rng.normal(0, 0.5, (7, 3))
    t = tau_ci(a, b, draws=500)
    ref = stats.kendalltau(a[:, 0], b.mean(1), method="exact", alternative="greater")
    assert t.tau == pytest.approx(ref.statistic) and t.p == pytest.approx(ref.pvalue)
    assert t.lo <= t.tau <= t.hi and t.n == 7
    exact = tau_ci(np.arange(6)[:, None], np.arange(6)[:, None] * np.ones((6, 3)), draws=50)
    assert exact.tau == 1.0 and exact.p == pytest.approx(1 / 720) and exact.lo == exact.hi == 1.0


@pytest.mark.parametrize("n", [201, 2_000])
@pytest.mark.parametrize("levels", [None, 3, 40])
def test_kendall_tau_by_sorting_equals_scipy_and_every_pair(n, levels):
    """Past _PAIRWISE items kendall_tau counts inversions (O(n log n)): scipy's τ-b is the
    oracle, and the every-pair count on the same data agrees to rounding, ties or not."""
    import nas.noise as noise
    rng = np.random.default_rng(n + (levels or 0))
    x = rng.normal(0, 1, n)
    y = x + rng.normal(0, 1, n)
    if levels:  # ties in x, in y and in both
        x, y = np.round(x * levels / 3), np.round(y * levels / 3)
    fast = kendall_tau(x, y)
    assert fast == pytest.approx(stats.kendalltau(x, y, variant="b").statistic, abs=1e-12)
    i, j = np.triu_indices(n, k=1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    assert fast == pytest.approx((dx * dy).sum() / math.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy)), abs=1e-12)
    assert n > noise._PAIRWISE
    assert math.isnan(kendall_tau(np.ones(n), y)) and math.isnan(kendall_tau(x, np.ones(n)))


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


def test_spearman_and_the_joint_interval():
    from nas.noise import spearman
    rng = np.random.default_rng(15)
    x, y = rng.normal(0, 1, 9), rng.normal(0, 1, 9)
    y[2] = y[5]
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    a = rng.normal(0, 1, (6, 4))
    same = tau_ci(a, a.copy(), draws=200, joint=True)  # the same seeds on both sides: every draw agrees
    assert same.tau == same.lo == same.hi == 1.0 and same.rho == same.rho_lo == 1.0
    assert tau_ci(a, a.copy(), draws=200).lo < 1.0  # resampled independently, they need not
