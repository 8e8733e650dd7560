"""Pareto maths over measured objectives: dominance, fronts, crowding, hypervolume, knees.

numpy only. Every function takes ``values``, an ``(N, M)`` array-like of N points and M
objectives, and ``directions``, M strings ``"minimize"`` / ``"maximize"`` (optuna's words).
Internally every objective is turned into one to minimise by negating the maximised
columns, so one definition serves all directions.

Conventions:

- *Dominance.* ``a`` dominates ``b`` when ``a`` is no worse in every objective and strictly
  better in at least one. Identical rows do not dominate each other, so **duplicates are all
  on the same front**, and a row tied with a front member in one objective but worse in
  another is dominated.
- *Non-finite values* (NaN, ±inf) are rejected with a :class:`ValueError` naming the rows:
  a NaN has no order, and an infinite quality would make hypervolume infinite. Drop failed
  or diverged trials before ranking.
- *Empty input* gives empty fronts, a hypervolume of 0.0 and an empty crowding vector;
  :func:`knee_point` raises, since there is no index to return.
- Index arrays are sorted ascending and index rows of the original ``values``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "DIRECTIONS", "crowding_distance", "dominates", "epsilon_dominates", "hypervolume",
    "knee_point", "non_dominated_sort", "pareto_front",
]

DIRECTIONS = ("minimize", "maximize")
_MAX_EXACT_HV_POINTS = 256  # slicing is O(N^(M-1) log N): past 3 objectives keep N small


def _signs(directions: Sequence[str]) -> np.ndarray:
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise ValueError(f"directions must be 'minimize' or 'maximize', got {bad!r}")
    return np.array([1.0 if d == "minimize" else -1.0 for d in directions])


def _minimisation(values, directions: Sequence[str]) -> np.ndarray:
    """``values`` as a float ``(N, M)`` array in which every objective is minimised."""
    signs = _signs(directions)
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return np.empty((0, len(signs)))
    if arr.ndim != 2 or arr.shape[1] != len(signs):
        raise ValueError(
            f"values must have shape (N, {len(signs)}) to match {len(signs)} directions, "
            f"got {arr.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
    if bad.size:
        raise ValueError(
            f"non-finite objective values in rows {bad.tolist()}: drop failed or diverged "
            "points before ranking"
        )
    return arr * signs


def _dominance_matrix(f: np.ndarray) -> np.ndarray:
    """``D[i, j]`` is True when row i dominates row j (minimisation form). O(N^2 M)."""
    n = len(f)
    dom = np.zeros((n, n), dtype=bool)
    for i in range(n):
        no_worse = (f[i] <= f).all(axis=1)
        better = (f[i] < f).any(axis=1)
        dom[i] = no_worse & better
    return dom


def dominates(a, b, directions: Sequence[str]) -> bool:
    """Whether point ``a`` dominates point ``b`` (no worse everywhere, better somewhere)."""
    f = _minimisation([a, b], directions)
    return bool((f[0] <= f[1]).all() and (f[0] < f[1]).any())


def pareto_front(values, directions: Sequence[str]) -> np.ndarray:
    """Indices of the non-dominated rows of ``values``, ascending; duplicates all included."""
    f = _minimisation(values, directions)
    dominated = np.zeros(len(f), dtype=bool)
    for i in range(len(f)):
        no_worse = (f <= f[i]).all(axis=1)
        better = (f < f[i]).any(axis=1)
        dominated[i] = (no_worse & better).any()
    return np.flatnonzero(~dominated)


def non_dominated_sort(values, directions: Sequence[str]) -> list[np.ndarray]:
    """Successive fronts (NSGA-II's fast non-dominated sort), each an ascending index array.

    Front 0 is :func:`pareto_front`; front r holds the rows dominated only by rows of fronts
    < r. Every row appears in exactly one front.
    """
    f = _minimisation(values, directions)
    dom = _dominance_matrix(f)
    dominated_by = dom.sum(axis=0)  # how many rows dominate each row
    remaining = np.ones(len(f), dtype=bool)
    fronts = []
    while remaining.any():
        front = np.flatnonzero(remaining & (dominated_by == 0))
        fronts.append(front)
        remaining[front] = False
        dominated_by = dominated_by - dom[front].sum(axis=0)
    return fronts


def crowding_distance(values, directions: Sequence[str]) -> np.ndarray:
    """NSGA-II crowding distance of each row within the set ``values`` (usually one front).

    Per objective the rows are sorted (stably, so ties keep their row order); the first and
    last get ``inf``, an interior row adds ``(f[next] - f[prev]) / (f.max() - f.min())``. An
    objective constant over the set adds nothing. With two rows or fewer all are ``inf``.
    Among identical extreme rows only the first in row order is the extreme. Directions only
    validate: the distance is symmetric in them.
    """
    f = _minimisation(values, directions)
    n = len(f)
    dist = np.zeros(n)
    if n <= 2:
        return np.full(n, np.inf)
    for col in f.T:
        order = np.argsort(col, kind="stable")
        span = col[order[-1]] - col[order[0]]
        dist[order[0]] = dist[order[-1]] = np.inf
        if span > 0:
            dist[order[1:-1]] += (col[order[2:]] - col[order[:-2]]) / span
    return dist


def _hv2(f: np.ndarray, ref: np.ndarray) -> float:
    """Area dominated by 2-D points (all strictly better than ``ref``), by one sweep in x."""
    f = f[np.lexsort((f[:, 1], f[:, 0]))]
    area, best_y = 0.0, ref[1]
    for x, y in f:
        if y < best_y:
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return area


def _hv(f: np.ndarray, ref: np.ndarray) -> float:
    """Exact hypervolume by slicing along the last objective down to the 2-D sweep."""
    if len(f) == 0:
        return 0.0
    if f.shape[1] == 1:
        return float(ref[0] - f[:, 0].min())
    if f.shape[1] == 2:
        return _hv2(f, ref)
    f = f[np.argsort(f[:, -1], kind="stable")]
    levels = np.append(f[:, -1], ref[-1])
    volume = 0.0
    for i in range(len(f)):
        thickness = levels[i + 1] - levels[i]
        if thickness > 0:
            volume += thickness * _hv(f[: i + 1, :-1], ref[:-1])
    return volume


def hypervolume(values, directions: Sequence[str], reference) -> float:
    """Volume of objective space dominated by ``values`` and bounded by ``reference``.

    ``reference`` is a point in the same units and directions as ``values`` (a worst
    acceptable value per objective: above every minimised value, below every maximised one).
    Rows not strictly better than the reference in every objective add nothing. Exact for
    any M by slicing; past 3 objectives it is exponential in M, so it raises beyond
    256 points there.
    """
    f = _minimisation(values, directions)
    ref = _minimisation(np.asarray(reference, dtype=float)[None, :], directions)[0]
    f = f[(f < ref).all(axis=1)]
    if f.shape[1] > 3 and len(f) > _MAX_EXACT_HV_POINTS:
        raise ValueError(
            f"exact hypervolume of {len(f)} points in {f.shape[1]} objectives is too slow; "
            f"use at most 3 objectives or {_MAX_EXACT_HV_POINTS} points"
        )
    if len(f):
        f = f[pareto_front(f, ["minimize"] * f.shape[1])]
    return float(_hv(f, ref))


def knee_point(values, directions: Sequence[str]) -> int:
    """Index (into ``values``) of the front's knee: the best trade-off, all objectives equal.

    The front is normalised per objective to [0, 1] (its best value → 0, its worst → 1; an
    objective constant on the front → 0) and the knee is the member farthest below the
    hyperplane ``Σ z = 1`` on the side of the ideal point, i.e. the member with the least
    sum of normalised objectives. With 2 objectives that hyperplane is the line through the
    front's two extremes, (0, 1) and (1, 0), so this is the classic maximum distance to the
    extremes' line. Ties go to the lowest row index; raises on empty input.
    """
    f = _minimisation(values, directions)
    if len(f) == 0:
        raise ValueError("knee_point of an empty set")
    front = pareto_front(f, ["minimize"] * f.shape[1])
    g = f[front]
    lo, span = g.min(axis=0), np.ptp(g, axis=0)
    z = np.divide(g - lo, span, out=np.zeros_like(g), where=span > 0)
    return int(front[np.argmin(z.sum(axis=1))])


def epsilon_dominates(a, b, directions: Sequence[str], eps, *, kind: str = "additive") -> bool:
    """Whether ``a`` ε-dominates ``b``: ``a``, relaxed by ε, is no worse than ``b`` anywhere.

    ``eps`` is a scalar or one value per objective. Additive: ``a_i - ε_i <= b_i`` for a
    minimised objective, ``a_i + ε_i >= b_i`` for a maximised one. Multiplicative (positive
    values only): ``a_i <= (1 + ε_i) b_i`` / ``a_i (1 + ε_i) >= b_i``. This is *weak*
    dominance relaxed, so with ε = 0 a point ε-dominates its duplicate and every point it
    dominates.
    """
    signs = _signs(directions)
    pair = np.asarray([a, b], dtype=float)
    _minimisation(pair, directions)  # shape and finiteness checks
    eps = np.broadcast_to(np.asarray(eps, dtype=float), signs.shape)
    if (eps < 0).any():
        raise ValueError(f"eps must be non-negative, got {eps.tolist()}")
    a, b = pair
    if kind == "additive":
        return bool((signs * (a - signs * eps) <= signs * b).all())
    if kind == "multiplicative":
        if (pair <= 0).any():
            raise ValueError("multiplicative ε-dominance needs positive values")
        relaxed = np.where(signs > 0, a / (1 + eps), a * (1 + eps))
        return bool((signs * relaxed <= signs * b).all())
    raise ValueError(f"kind must be 'additive' or 'multiplicative', got {kind!r}")
