"""Seed noise: replicate means and standard errors, the probability of being on a front,
whether neighbours differ beyond noise, permutation tests and rank agreement.

numpy only (no torch, no scipy needed). A *replicate* is one training run of a candidate
with its own seed (initialisation and data order; the eval batches are shared). Every
comparison the platform prints comes from here, so a front, a calibration and early
stopping all use one definition of "beyond seed noise": a difference larger than
``Z`` combined standard errors.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .pareto import pareto_front

__all__ = ["Z", "beyond_noise", "kendall_tau", "mean_se", "p_front", "permutation_floor",
           "permutation_test", "pooled_variance", "tied_neighbours"]

Z = 2.0  # "beyond seed noise": |difference| > Z · combined standard error


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
    a standard error is unknown (one replicate)."""
    if not (math.isfinite(se_a) and math.isfinite(se_b)):
        return None
    return abs(a - b) > z * math.hypot(se_a, se_b)


def p_front(replicates: Sequence[np.ndarray], directions: Sequence[str], draws: int = 1000,
            seed: int = 0) -> np.ndarray:
    """Each candidate's probability of being on the Pareto front of replicate means.

    ``replicates[i]`` is an ``(n_i, M)`` array: candidate i's objective values, one row per
    replicate (cost objectives repeat the same value). Estimated by the nonparametric
    bootstrap: each draw resamples every candidate's replicates with replacement, takes
    their means and computes the front; ``p_front`` is the share of draws in which the
    candidate is on it. A candidate with one replicate is fixed at its value in every draw,
    so with one replicate everywhere the answer is 0 or 1 (noise unknown).
    """
    reps = [np.atleast_2d(np.asarray(r, dtype=float)) for r in replicates]
    if not reps:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    hits = np.zeros(len(reps))
    for _ in range(draws):
        means = np.stack([r[rng.integers(0, len(r), len(r))].mean(axis=0) for r in reps])
        hits[pareto_front(means, directions)] += 1
    return hits / draws


def tied_neighbours(quality: Sequence[float], se: Sequence[float], z: float = Z) -> list[bool | None]:
    """For front members in cost order: whether each pair of neighbours (i, i+1) differs in
    quality by no more than ``z`` combined standard errors (True: tied within noise; None:
    noise unknown). One entry per adjacent pair."""
    out = []
    for i in range(len(quality) - 1):
        sep = beyond_noise(quality[i], se[i], quality[i + 1], se[i + 1], z)
        out.append(None if sep is None else not sep)
    return out


def permutation_test(cells: Sequence[Sequence[Sequence[float]]], permutations: int = 4000,
                     seed: int = 0) -> float:
    """p-value of "the level makes no difference" for a blocked one-factor design.

    ``cells[c][l]`` holds the replicate values of level l in context (block) c. The
    statistic is the between-level sum of squares of cell means within each context,
    summed over contexts; under the null hypothesis the values of one context are
    exchangeable across its levels, so each permutation shuffles them within the context
    (keeping every cell's size). Returns ``(1 + #{stat ≥ observed}) / (1 + permutations)``
    (Monte Carlo with the observed assignment counted, so never 0).
    """
    blocks = [[np.asarray(v, dtype=float) for v in ctx] for ctx in cells]
    blocks = [b for b in blocks if len(b) >= 2 and all(v.size for v in b)]
    if not blocks:
        return float("nan")

    def stat(bs) -> float:
        total = 0.0
        for b in bs:
            means = np.array([v.mean() for v in b])
            sizes = np.array([v.size for v in b])
            grand = (means * sizes).sum() / sizes.sum()
            total += float((sizes * (means - grand) ** 2).sum())
        return total

    observed = stat(blocks)
    rng = np.random.default_rng(seed)
    flat = [(np.concatenate(b), np.cumsum([v.size for v in b])[:-1]) for b in blocks]
    hits = 0
    for _ in range(permutations):
        shuffled = [np.split(rng.permutation(values), cuts) for values, cuts in flat]
        hits += stat(shuffled) >= observed - 1e-12 * max(1.0, abs(observed))
    return (1 + hits) / (1 + permutations)


def permutation_floor(sizes: Sequence[Sequence[int]]) -> float:
    """The smallest p-value :func:`permutation_test` can give for a design whose context c has
    cells of ``sizes[c]`` replicates: the share of within-context relabellings that reach the
    largest statistic, i.e. the observed split itself and its copies with equal-sized cells'
    labels swapped (Σ (n_l (mean_l − mean)²) does not see labels). Three seeds of two levels:
    2 / C(6, 3) = 0.1, so no effect, however large, reaches p < 0.01 there."""
    floor = 1.0
    for cells in sizes:
        cells = [n for n in cells if n]
        if len(cells) < 2:
            continue
        orderings = math.factorial(sum(cells))
        for n in cells:
            orderings //= math.factorial(n)
        swaps = math.prod(math.factorial(cells.count(n)) for n in set(cells))
        floor *= swaps / orderings
    return floor


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ-b (ties in either ranking corrected); NaN when either ranking is all ties."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    i, j = np.triu_indices(len(x), k=1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    denom = math.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy))
    return float((dx * dy).sum() / denom) if denom else float("nan")
