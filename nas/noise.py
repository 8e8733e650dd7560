"""Seed noise: replicate means and standard errors, tests that use the design (paired by
seed, exact at the floor), the probability of being on a front, and rank agreement.

A *replicate* is one training run of a candidate with its own seed (initialisation and data
order); every candidate's replicate i uses seed ``search.seed + i`` and all of them are
scored on the same eval batches. Candidates that share seeds are therefore *paired*: a
seed that is lucky for one candidate tends to be lucky for the others, and the difference
of two candidates on one seed is sharper than either score. Every test here uses that
pairing where the seeds are shared and says when it falls back to treating replicates as
independent (unequal or failed replicates).

- :func:`compare`: two candidates (the front's ``≈``, transfer's pairs): a paired t-test
  over shared seeds, else Welch's; a pair *differs beyond seed noise* when its p is below
  :data:`TIE_ALPHA`, a stated per-pair false-positive rate (measured in
  ``tests/nas/test_noise.py``).
- :func:`permutation_test`: one factor in blocks (calibrate's axes): levels shuffled within
  each (context, seed) block when seeds are shared, within each context otherwise; exact
  where the relabellings can be enumerated, else Monte Carlo with a stated interval whose
  upper end decides. Never below the design's floor.
- :func:`p_front`: a paired bootstrap (seed indices resampled jointly across candidates).
- :func:`holm`: the multiplicity adjustment of a family of tests.
- :func:`tau_ci`: Kendall τ with a seed-resampling interval and its exact permutation p.

numpy, plus scipy's distributions (imported lazily: validate, cost and the front's ties
(:func:`compare`, by :func:`t_sf`) never load it).
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


__all__ = ["TIE_ALPHA", "Z", "PairTest", "PermutationResult", "SeedEffect", "TauCI", "beyond_noise",
           "compare", "front_candidates", "holm", "kendall_tau", "mean_se", "p_front", "p_text", "paired_seeds",
           "permutation_floor", "permutation_test", "pooled_variance", "seed_effect", "spearman", "t_sf",
           "tau_ci", "tied_neighbours"]

Z = 2.0  # early stopping's margin: beaten by more than Z combined standard errors
TIE_ALPHA = 0.05  # a pair differs beyond seed noise when its two-sided test gives p < TIE_ALPHA
EXACT_LIMIT = 1_000_000  # enumerated per context and for all contexts but the largest; above, Monte Carlo
MC_DRAWS = (20_000, 400_000)  # Monte Carlo: first batch, most draws
MC_LEVEL = 0.99  # the Monte Carlo interval whose upper end decides


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample s.d. / sqrt(n)); s.e. is NaN for one value."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("mean_se of no values")
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else float("nan")
    return float(arr.mean()), se


def pooled_variance(groups: Sequence[Sequence[float]]) -> float:
    """Within-group variance pooled over groups of ≥ 2 values (degrees of freedom weighted);
    NaN when no group has two values."""
    ss, dof = 0.0, 0
    for g in groups:
        arr = np.asarray(g, dtype=float)
        if arr.size > 1:
            ss += float(((arr - arr.mean()) ** 2).sum())
            dof += arr.size - 1
    return ss / dof if dof else float("nan")


def beyond_noise(a: float, se_a: float, b: float, se_b: float, z: float = Z) -> bool | None:
    """Whether ``a`` and ``b`` differ by more than ``z`` combined standard errors; None when
    a standard error is unknown (one replicate). Early stopping's rule (a margin, not a test)."""
    if not (math.isfinite(se_a) and math.isfinite(se_b)):
        return None
    return abs(a - b) > z * math.hypot(se_a, se_b)


# ---- two candidates ---------------------------------------------------------------------


@dataclass(frozen=True)
class PairTest:
    """Candidate a against candidate b: ``diff`` = mean a − mean b, ``se`` its standard error
    (of the per-seed differences when ``paired``), ``p`` two-sided, ``n`` seeds (paired) or
    the smaller replicate count, ``test`` in words. ``p`` is NaN when noise is unknown."""

    diff: float
    se: float
    p: float
    n: int
    paired: bool
    test: str

    def separated(self, alpha: float = TIE_ALPHA) -> bool | None:
        """Whether the pair differs beyond seed noise (None: noise unknown)."""
        return None if not math.isfinite(self.p) else self.p < alpha


def paired_seeds(*seed_lists: Sequence[int] | None) -> list[int] | None:
    """The seeds every list holds exactly once when all lists hold the same ≥ 2 seeds, else
    None (pairing is not possible: unequal or failed replicates, or seeds not known)."""
    if not seed_lists or any(s is None for s in seed_lists):
        return None
    first = list(seed_lists[0])
    if len(first) < 2 or len(set(first)) != len(first):
        return None
    if any(len(s) != len(first) or set(s) != set(first) for s in seed_lists[1:]):
        return None
    return sorted(first)


def _by_seed(values: Sequence[float], seeds: Sequence[int], order: list[int]) -> np.ndarray:
    at = dict(zip(seeds, values))
    return np.array([at[s] for s in order], dtype=float)


def compare(a: Sequence[float], b: Sequence[float], seeds_a: Sequence[int] | None = None,
            seeds_b: Sequence[int] | None = None) -> PairTest:
    """Two candidates' replicates: a paired t-test over their shared seeds (``scipy.stats.
    ttest_rel``'s statistic) when both seed lists are given and hold the same seeds, else
    Welch's unequal-variance t-test (``ttest_ind(equal_var=False)``); the p value from
    :func:`t_sf`, without scipy.

    A zero spread with a non-zero difference is p = 0 (every seed agrees exactly); with no
    difference either, p = 1."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    order = paired_seeds(seeds_a, seeds_b)
    if order is not None:
        d = _by_seed(a, seeds_a, order) - _by_seed(b, seeds_b, order)
        n = d.size
        se = float(d.std(ddof=1) / math.sqrt(n))
        diff = float(d.mean())
        p = _t_p(diff, se, n - 1)
        return PairTest(diff, se, p, n, True, f"paired t-test over {n} shared seeds")
    diff = float(a.mean() - b.mean()) if a.size and b.size else math.nan
    if a.size < 2 or b.size < 2:
        return PairTest(diff, math.nan, math.nan, min(a.size, b.size), False, "noise unknown (one replicate)")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if va + vb > 0 else 1.0
    why = "seeds not shared" if seeds_a is not None and seeds_b is not None else "seeds not known"
    return PairTest(diff, se, _t_p(diff, se, dof), min(a.size, b.size), False,
                    f"Welch t-test ({why}: replicates treated as independent)")


def _t_p(diff: float, se: float, dof: float) -> float:
    if not math.isfinite(se):
        return math.nan
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return min(1.0, 2 * t_sf(abs(diff / se), dof))


def t_sf(t: float, dof: float) -> float:
    """Student's t survival function P(T > t), ``t ≥ 0``: ``I_x(dof/2, 1/2) / 2`` with
    ``x = dof / (dof + t²)``, the regularized incomplete beta by its continued fraction
    (modified Lentz). Pure Python, so the front's ties (``loopnas status``) do not import
    scipy.stats (half a second). Equal to ``scipy.stats.t.sf`` to 1e-13 relative up to 10
    degrees of freedom, 1e-11 up to 200, 2e-10 up to 10,000 (``tests/nas/test_noise.py``)."""
    if math.isnan(t) or math.isnan(dof):
        return math.nan
    if t <= 0:
        return 0.5 if t == 0 else 1.0 - t_sf(-t, dof)
    if math.isinf(t):
        return 0.0
    a, b = dof / 2, 0.5
    t2 = t * t
    x, y = dof / (dof + t2), t2 / (dof + t2)  # y = 1 - x without cancellation
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1) / (a + b + 2):
        return 0.5 * math.exp(log_front) * _betacf(a, b, x, y) / a
    return 0.5 * (1.0 - math.exp(log_front) * _betacf(b, a, y, x) / b)


def _betacf(a: float, b: float, x: float, y: float) -> float:
    """The continued fraction of the incomplete beta (Numerical Recipes' betacf; ``y = 1 - x``)."""
    tiny, eps = 1e-300, 1e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def tied_neighbours(tests: Sequence[PairTest], alpha: float = TIE_ALPHA) -> list[bool | None]:
    """For each adjacent pair of front members (in cost order), its :func:`compare`: True
    when the two are within seed noise (p ≥ ``alpha``), None when noise is unknown."""
    out = []
    for t in tests:
        sep = t.separated(alpha)
        out.append(None if sep is None else not sep)
    return out


# ---- the probability of being on the front ---------------------------------------------


def p_front(replicates: Sequence[np.ndarray], directions: Sequence[str], draws: int = 1000,
            seed: int = 0, seeds: Sequence[Sequence[int] | None] | None = None) -> np.ndarray:
    """Each candidate's probability of being on the Pareto front of replicate means.

    ``replicates[i]`` is an ``(n_i, M)`` array: candidate i's objective values, one row per
    replicate (cost objectives repeat the same value); ``seeds[i]`` the seed of each row.
    Each bootstrap draw resamples replicates with replacement, takes their means and
    computes the front; ``p_front`` is the share of draws in which the candidate is on it.
    *Paired* when every candidate with two or more replicates holds the same seeds: a draw
    picks seed indices once and every candidate uses them, so a seed's shared luck moves
    all candidates together, as it did in training. Otherwise each candidate resamples its
    own (unpaired). A candidate with one replicate is fixed at its value in every draw, so
    with one replicate everywhere the answer is 0 or 1 (noise unknown).

    Only candidates that can reach the front are resampled: one dominated *in every
    possible draw* by a member of the front of the means is 0 exactly, not estimated
    (paired: it is dominated on every seed; unpaired: its best replicate is dominated by the
    member's worst). Removing such candidates changes no other candidate's front in any
    draw, so paired, the result is the one every candidate resampled gives, draw for draw
    (the same seed indices, the same means); unpaired, the draws are taken per group of
    candidates with the same replicate count, a stream of its own (the same distribution).
    The front of a draw is a sort for two objectives (O(n log n)), a sweep otherwise.
    """
    reps, order = _aligned(replicates, seeds)
    if not reps:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    signs = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    idx = rng.integers(0, len(order), (draws, len(order))) if order is not None else None
    keep = _candidates(reps, signs, idx)
    hits = np.zeros(len(reps))
    if idx is not None:
        hits[keep] = _paired_hits([reps[i] for i in keep], signs, idx)
    else:
        hits[keep] = _unpaired_hits([reps[i] for i in keep], signs, draws, rng)
    return hits / draws


def front_candidates(replicates: Sequence[np.ndarray], directions: Sequence[str], draws: int = 1000,
                     seed: int = 0, seeds: Sequence[Sequence[int] | None] | None = None) -> np.ndarray:
    """Indices of the candidates :func:`p_front` (same arguments) resamples: every other is
    dominated in each of its draws by one of these, so ``p_front`` of these alone (with
    their seeds) is ``p_front`` of all, draw for draw when paired."""
    reps, order = _aligned(replicates, seeds)
    if not reps:
        return np.zeros(0, dtype=int)
    signs = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    rng = np.random.default_rng(seed)
    return _candidates(reps, signs, rng.integers(0, len(order), (draws, len(order))) if order is not None else None)


def _aligned(replicates, seeds) -> tuple[list[np.ndarray], list[int] | None]:
    """The replicate arrays, rows in seed order when paired, and the shared seeds (None: unpaired)."""
    reps = [np.atleast_2d(np.asarray(r, dtype=float)) for r in replicates]
    multi = [i for i, r in enumerate(reps) if len(r) > 1]
    order = paired_seeds(*[seeds[i] for i in multi]) if seeds is not None and multi else None
    if order is not None:
        for i in multi:
            if list(seeds[i]) != order:  # rows already in seed order (the usual case) stay as they are
                at = {s: j for j, s in enumerate(seeds[i])}
                reps[i] = reps[i][[at[s] for s in order]]
    return reps, order


def _candidates(reps: list[np.ndarray], signs: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
    keep = _reachable(reps, signs, idx is not None)
    if idx is not None and len(signs) == 2:
        keep = keep[_drawn_reachable([reps[i] for i in keep], signs, idx)]
    return keep


def _nondominated(f: np.ndarray) -> np.ndarray:
    """Mask of the rows of ``f`` (minimised) that no row dominates; duplicates all kept."""
    n, m = f.shape
    if n == 0:
        return np.zeros(0, dtype=bool)
    if m == 2:
        o = np.lexsort((f[:, 1], f[:, 0]))
        x, y = f[o, 0], f[o, 1]
        start = np.r_[True, x[1:] != x[:-1]]  # groups of equal x, each sorted by y
        first = np.flatnonzero(start)
        group = np.cumsum(start) - 1
        before = np.r_[np.inf, np.minimum.accumulate(y)[first[1:] - 1]]  # least y at a smaller x
        out = np.empty(n, dtype=bool)
        out[o] = ~((before[group] <= y) | (y[first][group] < y))
        return out
    out = np.zeros(n, dtype=bool)
    kept = np.empty((0, m))
    for i in np.lexsort(f.T[::-1]):  # a dominator sorts before what it dominates
        if not ((kept <= f[i]).all(1) & (kept < f[i]).any(1)).any():
            out[i] = True
            kept = np.vstack([kept, f[i]])
    return out


def _reachable(reps: list[np.ndarray], signs: np.ndarray, paired: bool) -> np.ndarray:
    """Indices of candidates not dominated in every possible draw by a member of the front
    of the means (which the draw of every replicate once keeps on the front)."""
    if paired:
        s = max(len(r) for r in reps)
        rows = _stacked(reps, s)  # (N, S, M), one replicate repeated S times
        means = np.stack([r.mean(axis=0) for r in reps]) * signs if s == 1 else \
            _means(reps, rows) * signs
        rows = rows * signs
    else:
        means = np.stack([r.mean(axis=0) for r in reps]) * signs
    members = np.flatnonzero(_nondominated(means))
    if paired:
        always = np.zeros(len(reps), dtype=bool)
        for j in members:  # dominated on every seed: dominated under any weights on the seeds
            always |= (rows[j] <= rows).all(axis=(1, 2)) & (rows[j] < rows).any(axis=2).all(axis=1)
    else:
        best = np.stack([(r * signs).min(axis=0) for r in reps])
        worst = np.stack([(r * signs).max(axis=0) for r in reps])
        always = np.zeros(len(reps), dtype=bool)
        for j in members:
            always |= (worst[j] <= best).all(axis=1) & (worst[j] < best).any(axis=1)
    return np.flatnonzero(~always)


def _stacked(reps: list[np.ndarray], s: int) -> np.ndarray:
    """``(N, s, M)``: each candidate's ``s`` rows (paired: all hold ``s`` or one, repeated)."""
    m = reps[0].shape[1]
    out = np.empty((len(reps), s, m))
    for size in {len(r) for r in reps}:
        idx = [i for i, r in enumerate(reps) if len(r) == size]
        out[idx] = np.stack([reps[i] for i in idx])  # (k, size, M): size is s or 1 (broadcast)
    return out


def _means(reps: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Each candidate's mean row, as ``r.mean(axis=0)`` (the same sum, in the same order:
    numpy adds the rows of a small reduced axis one after another); one replicate: itself."""
    out = rows.mean(axis=1)
    single = [i for i, r in enumerate(reps) if len(r) == 1]
    out[single] = rows[single, 0]
    return out


def _drawn_reachable(reps: list[np.ndarray], signs: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Two objectives, paired: mask of the candidates that some drawn resample (a multiset of
    seed indices in ``idx``) does not dominate by more than rounding. Per distinct resample,
    a candidate is out when another's means are lower in both objectives by a margin no
    summation order can close (64 × seeds × ε × the column's largest value)."""
    s = idx.shape[1]
    rows = _stacked(reps, s) * signs  # (N, S, 2)
    weights = np.stack([np.bincount(c, minlength=s) for c in np.unique(np.sort(idx, axis=1), axis=0)]) / s
    tol = 64 * s * np.finfo(float).eps * np.abs(rows).max(axis=(0, 1))
    out = np.zeros(len(reps), dtype=bool)
    for w in weights:
        mu = np.einsum("s,nsm->nm", w, rows)
        o = np.argsort(mu[:, 0], kind="stable")
        x, low = mu[o, 0], np.minimum.accumulate(mu[o, 1])
        below = np.searchsorted(x, mu[:, 0] - 2 * tol[0], side="right")  # points clearly left of each
        beaten = (below > 0) & (low[np.maximum(below - 1, 0)] < mu[:, 1] - 2 * tol[1])
        out |= ~beaten
    return out


def _paired_hits(reps: list[np.ndarray], signs: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Draws on the front per candidate; ``idx[d]``: draw d's seed indices, shared."""
    fixed = np.array([len(r) == 1 for r in reps])
    out = np.zeros(len(reps))
    if not len(reps):
        return out
    m = reps[0].shape[1]
    base = np.stack([r[0] if len(r) == 1 else np.zeros(m) for r in reps])
    rows = np.stack([r for r in reps if len(r) > 1]) if (~fixed).any() else np.zeros((0, idx.shape[1], m))
    batch = max(1, 4_000_000 // max(1, rows.size))
    for lo in range(0, len(idx), batch):
        means = rows[:, idx[lo:lo + batch]].mean(axis=2)  # (K, B, M): each draw's means, as r[idx].mean(0)
        for b in range(means.shape[1]):
            f = base.copy()
            f[~fixed] = means[:, b]
            out += _nondominated(f * signs)
    return out


def _unpaired_hits(reps: list[np.ndarray], signs: np.ndarray, draws: int, rng) -> np.ndarray:
    """Draws on the front per candidate, each resampling its own replicates."""
    out = np.zeros(len(reps))
    if not len(reps):
        return out
    base = np.stack([r.mean(axis=0) for r in reps])
    groups = {}
    for i, r in enumerate(reps):
        if len(r) > 1:
            groups.setdefault(len(r), []).append(i)
    stacked = {n: np.stack([reps[i] for i in ix]) for n, ix in groups.items()}  # (K_n, n, M)
    for _ in range(draws):
        f = base.copy()
        for n, ix in groups.items():
            pick = rng.integers(0, n, (len(ix), n))
            f[ix] = np.take_along_axis(stacked[n], pick[:, :, None], axis=1).mean(axis=1)
        out += _nondominated(f * signs)
    return out


# ---- one factor in blocks: the permutation test -----------------------------------------


@dataclass(frozen=True)
class PermutationResult:
    """A permutation test of "the level makes no difference".

    ``p``: exact, or the Monte Carlo estimate ``(1 + hits) / (1 + draws)``, never below
    ``floor``; ``p_upper``: the upper end of the Monte Carlo interval (``p`` when exact),
    on which decisions rest; ``floor``: the smallest p this design can give; ``paired``:
    shuffled within (context, seed) blocks; ``relabellings``: how many were counted (every
    distinct one when ``exact``, else the draws)."""

    p: float
    p_upper: float
    floor: float
    exact: bool
    paired: bool
    relabellings: int
    statistic: float
    unpaired_why: str = ""  # why replicates were treated as independent

    @property
    def at_floor(self) -> bool:
        return self.p <= self.floor * (1 + 1e-9)

    @property
    def test(self) -> str:
        how = "exact permutation test" if self.exact else \
            f"Monte Carlo permutation test ({self.relabellings} draws)"
        return f"{how}, " + ("paired by seed" if self.paired else f"unpaired ({self.unpaired_why})")


def _nan_result() -> PermutationResult:
    return PermutationResult(math.nan, math.nan, 1.0, True, False, 0, math.nan, "nothing to compare")


def p_text(p: float, floor: float | None = None, exact: bool = True, p_upper: float | None = None) -> str:
    """``p = 0.0018``, ``p ≤ 0.00077 (the design's floor)`` or ``p ≈ 0.003 (Monte Carlo,
    99% ≤ 0.0036)``: a p-value as it may be printed (never below what the design can give)."""
    if p is None or not math.isfinite(p):
        return "p = —"
    if floor is not None and p <= floor * (1 + 1e-9):
        return f"p ≤ {floor:.2g} (the design's floor)"
    if not exact and p_upper is not None:
        return f"p ≈ {p:.2g} (Monte Carlo, {MC_LEVEL:.0%} ≤ {p_upper:.2g})"
    return f"p = {p:.3g}"


def _ss(sums: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Between-level sum of squares from level sums (..., L) and sizes (L,)."""
    n = sizes.sum()
    return (sums ** 2 / sizes).sum(-1) - sums.sum(-1) ** 2 / n


def _paired_blocks(cells, seeds) -> list[np.ndarray] | None:
    """Per context an (S, L) array ordered by seed, or None when any context is not a
    complete block of shared seeds."""
    if seeds is None:
        return None
    out = []
    for ctx_vals, ctx_seeds in zip(cells, seeds):
        order = paired_seeds(*ctx_seeds)
        if order is None:
            return None
        out.append(np.stack([_by_seed(v, s, order) for v, s in zip(ctx_vals, ctx_seeds)], axis=1))
    return out


def _why_unpaired(seed_blocks) -> str:
    if seed_blocks is None:
        return "seeds not known"
    if any(len(set(s)) != len(s) for ctx in seed_blocks for s in ctx):
        return "a level holds several candidates per seed (a conditional parameter averaged)"
    return "seeds not shared by every level"


def _multinomial(sizes: Sequence[int]) -> int:
    out = math.factorial(sum(sizes))
    for n in sizes:
        out //= math.factorial(n)
    return out


def _swaps(sizes: Sequence[int]) -> int:
    """Relabellings of equal-sized levels: the statistic does not see level names."""
    return math.prod(math.factorial(list(sizes).count(n)) for n in set(sizes))


def permutation_floor(sizes: Sequence[Sequence[int]], paired: bool = False) -> float:
    """The smallest p-value :func:`permutation_test` can give for a design whose context c
    has cells of ``sizes[c]`` replicates: the share of relabellings that reach the largest
    statistic, i.e. the observed split itself and its copies with equal-sized levels' labels
    swapped. Unpaired, a context of L cells has multinomial(N; n_1..n_L) relabellings; paired
    (every cell the same S seeds) it has (L!)^S, of which L! relabel the levels everywhere.
    Two levels × 3 seeds: 2 / C(6, 3) = 0.1 unpaired, 2 / 2³ = 0.25 paired; contexts multiply."""
    floor = Fraction(1)  # exact: a p at the floor must not pass a threshold by rounding
    for cells in sizes:
        cells = [n for n in cells if n]
        if len(cells) < 2:
            continue
        if paired:
            floor *= Fraction(math.factorial(len(cells)), math.factorial(len(cells)) ** cells[0])
        else:
            floor *= Fraction(_swaps(cells), _multinomial(cells))
    return float(floor)


def _unpaired_stats(values: list[np.ndarray]) -> np.ndarray:
    """Every distinct assignment of one context's values to its cells: the statistic of each."""
    flat = np.concatenate(values)
    sizes = np.array([v.size for v in values])
    idx = np.arange(flat.size)
    # choose each level's members from the indices left by the levels before it
    sums, remaining = np.zeros((1, 0)), idx[None, :]
    for n in sizes[:-1]:
        combos = np.array(list(itertools.combinations(range(remaining.shape[1]), int(n))), dtype=int)
        rest = np.array([[j for j in range(remaining.shape[1]) if j not in set(c)] for c in combos], dtype=int)
        chosen = remaining[:, combos]  # (rows, C, n)
        level = flat[chosen].sum(-1)  # (rows, C)
        sums = np.concatenate([np.repeat(sums, len(combos), axis=0), level.reshape(-1, 1)], axis=1)
        remaining = remaining[:, rest].reshape(-1, rest.shape[1])
    sums = np.concatenate([sums, flat[remaining].sum(-1, keepdims=True)], axis=1)
    return _ss(sums, sizes.astype(float))


def _paired_stats(block: np.ndarray) -> np.ndarray:
    """Every relabelling of one context's (S, L) block, levels shuffled within each seed."""
    S, L = block.shape
    perms = np.array(list(itertools.permutations(range(L))))
    sums = np.zeros((1, L))
    for s in range(S):
        sums = (sums[:, None, :] + block[s][perms][None, :, :]).reshape(-1, L)
    return _ss(sums, np.full(L, float(S)))


def _sum_distribution(per_context: list[np.ndarray]) -> np.ndarray:
    total = np.zeros(1)
    for st in per_context:
        total = (total[:, None] + st[None, :]).ravel()
    return total


def _mc_stats(blocks, paired: bool, rng, draws: int) -> np.ndarray:
    total = np.zeros(draws)
    for b in blocks:
        if paired:
            S, L = b.shape
            order = rng.random((draws, S, L)).argsort(-1)
            sums = np.take_along_axis(np.broadcast_to(b, (draws, S, L)), order, -1).sum(1)
            total += _ss(sums, np.full(L, float(S)))
        else:
            flat = np.concatenate(b)
            sizes = np.array([v.size for v in b], dtype=float)
            shuffled = flat[rng.random((draws, flat.size)).argsort(-1)]
            cuts = np.cumsum(sizes).astype(int)[:-1]
            sums = np.stack([s.sum(-1) for s in np.split(shuffled, cuts, axis=1)], axis=-1)
            total += _ss(sums, sizes)
    return total


def permutation_test(cells: Sequence[Sequence[Sequence[float]]],
                     seeds: Sequence[Sequence[Sequence[int]]] | None = None, alpha: float = 0.01,
                     seed: int = 0, exact_limit: int = EXACT_LIMIT,
                     thresholds: Sequence[float] = ()) -> PermutationResult:
    """A permutation test of "the level makes no difference" in a blocked one-factor design.

    ``cells[c][l]`` holds the replicate values of level l in context c, ``seeds[c][l]``
    their seeds. The statistic is the between-level sum of squares of cell means within
    each context, summed over contexts. Under the null hypothesis the values of one block
    are exchangeable across its levels; a block is a (context, seed) pair when every level
    of every context holds the same seeds (*paired*: the seed's shared luck cancels, which
    with complete blocks makes the statistic equivalent to the randomised-block F), else a
    context (unpaired). Paired is used when it can reach ``alpha`` (its floor is below it);
    with few seeds a paired design has fewer relabellings (2 levels × 5 seeds: 2⁵) than an
    unpaired one (C(10, 5)), so where only the unpaired test can reach ``alpha`` that one is
    used (it stays valid, conservatively, under a seed effect), and where neither can, the one
    with the smaller floor. The choice depends on the design alone, never on the values.

    Exact when each context's relabellings, and the product of all contexts' but the largest,
    number at most ``exact_limit`` (contexts are independent, so the largest one's sorted
    statistics are counted against the others' sums: 6¹⁰ relabellings cost 2 × 6⁵); otherwise Monte
    Carlo in batches until the ``MC_LEVEL`` Clopper–Pearson interval of p holds neither
    ``alpha`` nor any of ``thresholds`` (a multiplicity adjustment's, say), or the most draws
    are spent; ``p_upper`` is that interval's upper end, on which a decision should rest.
    """
    blocks = [[np.asarray(v, dtype=float) for v in ctx] for ctx in cells]
    keep = [i for i, b in enumerate(blocks) if len(b) >= 2 and all(v.size for v in b)]
    if not keep:
        return _nan_result()
    blocks = [blocks[i] for i in keep]
    seed_blocks = [seeds[i] for i in keep] if seeds is not None else None
    sizes = [[v.size for v in b] for b in blocks]
    paired_blocks = _paired_blocks(blocks, seed_blocks)
    paired = paired_blocks is not None and permutation_floor(sizes, paired=True) < alpha
    why = _why_unpaired(seed_blocks) if paired_blocks is None else \
        f"a paired test of {min(min(s) for s in sizes)} seeds cannot go below p = " \
        f"{permutation_floor(sizes, paired=True):.2g}"
    if paired_blocks is not None and not paired and permutation_floor(sizes) >= alpha:
        # neither reaches alpha: the one that can say more (the smaller floor)
        paired = permutation_floor(sizes, paired=True) <= permutation_floor(sizes)
    floor = permutation_floor(sizes, paired=paired)
    use = paired_blocks if paired else blocks
    observed = float(_observed(use, paired))
    tol = 1e-9 * max(1.0, abs(observed))
    counts = [math.factorial(b.shape[1]) ** b.shape[0] for b in use] if paired else \
        [_multinomial(s) for s in sizes]
    largest = max(range(len(counts)), key=counts.__getitem__)
    if counts[largest] <= exact_limit and math.prod(counts) // counts[largest] <= exact_limit:
        # contexts are independent: the other contexts' sums against the largest one, sorted
        per = [_paired_stats(b) if paired else _unpaired_stats(b) for b in use]
        rest = _sum_distribution(per[:largest] + per[largest + 1:])
        last = np.sort(per[largest])
        hits = int((last.size - np.searchsorted(last, observed - tol - rest, side="left")).sum())
        p = hits / math.prod(counts)
        return PermutationResult(max(p, floor), max(p, floor), floor, True, paired, math.prod(counts), observed, why)
    from scipy import stats

    rng = np.random.default_rng(seed)
    hits = draws = 0
    first, most = MC_DRAWS
    batch = first
    while True:
        st = _mc_stats(use, paired, rng, batch)
        hits += int((st >= observed - tol).sum())
        draws += batch
        lo = float(stats.beta.ppf((1 - MC_LEVEL) / 2, hits, draws - hits + 1)) if hits else 0.0
        hi = float(stats.beta.ppf(1 - (1 - MC_LEVEL) / 2, hits + 1, draws - hits))
        if draws >= most or not any(lo <= t <= hi for t in (alpha, *thresholds)):
            break
        batch = min(draws, most - draws)
    p = max((1 + hits) / (1 + draws), floor)
    return PermutationResult(p, max(hi, p), floor, False, paired, draws, observed, why)


def _observed(blocks, paired: bool) -> float:
    total = 0.0
    for b in blocks:
        if paired:
            total += float(_ss(b.sum(0), np.full(b.shape[1], float(b.shape[0]))))
        else:
            total += float(_ss(np.array([v.sum() for v in b]), np.array([v.size for v in b], dtype=float)))
    return total


# ---- the seed effect --------------------------------------------------------------------


@dataclass(frozen=True)
class SeedEffect:
    """A two-way (candidate × seed) analysis of complete replicates: ``share`` is the seed
    effect's share of the seed-to-seed variance (its variance component over the total of
    seed and residual components), ``p`` the F test of "seeds make no common difference"."""

    share: float
    p: float
    candidates: int
    seeds: int
    resid_var: float  # the seed-to-seed variance left after the seed effect: a paired difference's
    total_var: float  # the within-candidate variance ignoring seeds (what an unpaired test sees)


def seed_effect(values: Sequence[Sequence[float]], seeds: Sequence[Sequence[int]]) -> SeedEffect | None:
    """The seed effect across candidates that share seeds (rows: candidates), or None when
    fewer than two candidates hold the same ≥ 2 seeds."""
    from scipy import stats

    order = paired_seeds(*seeds) if len(values) >= 2 else None
    if order is None:
        return None
    y = np.stack([_by_seed(v, s, order) for v, s in zip(values, seeds)])  # (K, S)
    K, S = y.shape
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    ms_seed = K * ((y.mean(0) - y.mean()) ** 2).sum() / (S - 1)
    ms_resid = (resid ** 2).sum() / ((K - 1) * (S - 1))
    total = float(((y - y.mean(1, keepdims=True)) ** 2).sum() / (K * (S - 1)))
    if ms_resid == 0:
        return SeedEffect(1.0 if ms_seed > 0 else 0.0, 0.0 if ms_seed > 0 else 1.0, K, S, 0.0, total)
    p = float(stats.f.sf(ms_seed / ms_resid, S - 1, (K - 1) * (S - 1)))
    component = max(0.0, float(ms_seed - ms_resid) / K)
    return SeedEffect(component / (component + float(ms_resid)), p, K, S, float(ms_resid), total)


# ---- multiplicity -----------------------------------------------------------------------


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted): the family-wise
    error rate of deciding "adjusted p < α" is at most α over the whole family."""
    finite = [(p, i) for i, p in enumerate(ps) if p is not None and math.isfinite(p)]
    out = [math.nan] * len(ps)
    m, running = len(finite), 0.0
    for rank, (p, i) in enumerate(sorted(finite)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


# ---- rank agreement ---------------------------------------------------------------------


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ-b (ties in either ranking corrected); NaN when either ranking is all ties.

    Up to :data:`_PAIRWISE` items every pair is compared; past it Knight's O(n log n) count
    (the one scipy's ``kendalltau`` uses: sort by x then y, the discordant pairs are the
    inversions of y), so a report's rank agreement over 10,000 trials costs milliseconds."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n <= _PAIRWISE:
        i, j = np.triu_indices(n, k=1)
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        denom = math.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy))
        return float((dx * dy).sum() / denom) if denom else float("nan")
    if np.isnan(x).any() or np.isnan(y).any():
        return float("nan")
    order = np.lexsort((y, x))
    xs, ys = x[order], y[order]
    pairs = n * (n - 1) // 2

    def tied(*keys: np.ndarray) -> int:
        new = np.r_[True, np.any([k[1:] != k[:-1] for k in keys], axis=0)]
        runs = np.diff(np.r_[np.flatnonzero(new), n])
        return int((runs * (runs - 1) // 2).sum())

    ties_x, ties_xy = tied(xs), tied(xs, ys)
    ties_y = tied(np.sort(ys))
    seen: list[float] = []
    discordant = 0
    for j, v in enumerate(ys.tolist()):  # pairs i < j with y_i > y_j: x-ties are sorted by y, never counted
        discordant += j - bisect.bisect_right(seen, v)
        bisect.insort(seen, v)
    concordant = pairs - ties_x - ties_y + ties_xy - discordant
    denom = math.sqrt((pairs - ties_x) * (pairs - ties_y))
    return float((concordant - discordant) / denom) if denom else float("nan")


_PAIRWISE = 200  # items up to which kendall_tau compares every pair


@dataclass(frozen=True)
class TauCI:
    """Rank agreement of two rankings of the same candidates: Kendall τ and Spearman ρ, each
    with its ``level`` interval from resampling seeds, and the one-sided permutation p of
    τ > 0 (exact for n ≤ 8)."""

    tau: float
    lo: float
    hi: float
    p: float
    n: int
    rho: float = math.nan
    rho_lo: float = math.nan
    rho_hi: float = math.nan


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ: the correlation of average ranks (ties share their mean rank); NaN when
    either ranking is all ties."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(v: np.ndarray) -> np.ndarray:
    order = v.argsort(kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    for value in np.unique(v):
        tied = v == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def tau_ci(a: np.ndarray, b: np.ndarray, draws: int = 2000, seed: int = 0, level: float = 0.95,
           joint: bool = False) -> TauCI:
    """τ and ρ between the replicate means of ``a`` and ``b`` (candidates × replicates: a
    column is a seed; a one-column side is fixed). Each draw resamples each side's seed
    columns with replacement, jointly across candidates (the paired bootstrap), and with
    ``joint`` the same columns on both sides (the same seeds, as a transfer's scales hold)."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    n = a.shape[0]
    tau, rho = kendall_tau(a.mean(1), b.mean(1)), spearman(a.mean(1), b.mean(1))
    if n < 2 or not math.isfinite(tau):
        return TauCI(tau, math.nan, math.nan, math.nan, n, rho)
    rng = np.random.default_rng(seed)
    taus, rhos = [], []
    for _ in range(draws):
        ia = rng.integers(0, a.shape[1], a.shape[1])
        ib = ia if joint else rng.integers(0, b.shape[1], b.shape[1])
        ma = a[:, ia].mean(1) if a.shape[1] > 1 else a[:, 0]
        mb = b[:, ib].mean(1) if b.shape[1] > 1 else b[:, 0]
        taus.append(kendall_tau(ma, mb))
        rhos.append(spearman(ma, mb))
    q = [(1 - level) / 2, 1 - (1 - level) / 2]

    def ci(xs: list[float]) -> tuple[float, float]:
        xs = [x for x in xs if math.isfinite(x)]
        return tuple(float(v) for v in np.quantile(xs, q)) if xs else (math.nan, math.nan)

    (lo, hi), (rlo, rhi) = ci(taus), ci(rhos)
    return TauCI(tau, lo, hi, _tau_p(a.mean(1), b.mean(1), tau, rng), n, rho, rlo, rhi)


def _tau_p(x: np.ndarray, y: np.ndarray, tau: float, rng) -> float:
    """One-sided p of τ ≥ observed when y's order is unrelated to x's: every permutation for
    n ≤ 8, else 20,000 random ones (the observed counted)."""
    n = len(x)
    if n <= 8:
        taus = np.array([kendall_tau(x, y[list(p)]) for p in itertools.permutations(range(n))])
        return float((taus >= tau - 1e-12).mean())
    hits = sum(kendall_tau(x, y[rng.permutation(n)]) >= tau - 1e-12 for _ in range(20_000))
    return (1 + hits) / 20_001
