"""The current front of an experiment: every point of every complete trial (an elastic
trial contributes one point per loop count), ranked by ``nas.pareto`` on replicate means,
with each point's seed noise (``nas.noise``): its standard errors, its probability of being
on the front (a bootstrap paired by seed), and whether a front member is within noise of its
neighbours (``nas.noise.compare``: a paired t-test over shared seeds at
``nas.noise.TIE_ALPHA``, Welch's where seeds are not shared).

:func:`rank` is the one computation of a front, :func:`in_cost_order` its one order: the
experiment read-model (``runners.results.experiment``), :func:`front`, status, the report,
export's ``--pick`` and the sweep's progress line all go through them."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from nas.noise import TIE_ALPHA, PairTest, compare, front_candidates, p_front
from .records import Objective, TrialRecord

T = TypeVar("T")


@dataclass(frozen=True)
class FrontPoint:
    trial: str
    k: int | None
    values: dict[str, float]  # replicate means
    summary: str | None
    se: dict[str, float] = field(default_factory=dict)  # missing: one replicate, noise unknown
    n: int = 1
    p_front: float | None = None  # None: noise unknown (one replicate everywhere)
    tied: bool | None = None  # on the front: within seed noise of a neighbour (None: unknown)
    next_pair: PairTest | None = None  # on the front: the test against the next member in cost order


def all_points(records: list[TrialRecord]) -> list[FrontPoint]:
    """Points of complete trials (duplicates add nothing: they repeat their original)."""
    return [FrontPoint(r.id, p.k, p.values, r.summary, dict(p.se), p.n)
            for r in records if r.status == "complete" for p in r.points]


def cost_objectives(objectives: list[Objective]) -> list[Objective]:
    """The cost objectives, cost-model ones (known before training) first, then serving."""
    return [o for o in objectives if not o.measured] + [o for o in objectives if o.serving]


def cost_key(objectives: list[Objective]) -> str:
    """The objective a front is ordered by: the first cost objective, else the first objective."""
    return (cost_objectives(objectives) or objectives)[0].name


def in_cost_order(items: Iterable[T], objectives: list[Objective],
                  values: Callable[[T], Mapping[str, float]] = lambda x: x.values) -> list[T]:
    """``items`` (points, given in trial-number order and each trial's points as recorded) in
    the front's order: by the value of :func:`cost_key`, ascending; ties keep their order.
    The one order of a front, wherever it is shown."""
    key = cost_key(objectives)
    return sorted(items, key=lambda x: values(x)[key])


def finite_values(values: Mapping[str, float | None], names: Sequence[str]) -> bool:
    """Whether ``values`` has a finite number for each of ``names``: a point that can be ranked."""
    return all(values.get(n) is not None and math.isfinite(values[n]) for n in names)


def replicate_rows(replicates: Iterable, k: int | None, objectives: list[Objective],
                   values: Mapping[str, float]) -> tuple[np.ndarray, list[int] | None]:
    """``(n, M)`` and the seed of each row: one row per complete replicate that evaluated
    loop count ``k``, its measured objectives as it measured them and the rest from
    ``values`` (known exactly). ``replicates``: ``(seed, status, [(k, values), ...])`` of
    each (:func:`replicates_of` a record; a digest's ``reps`` give them directly). None for
    seeds, and the one row ``values``, when no replicate has a result (a record without
    replicates)."""
    fixed = [values[o.name] for o in objectives]
    measured = [(i, o.name) for i, o in enumerate(objectives) if o.measured]
    rows, seeds = [], []
    for seed, status, points in replicates:
        if status != "complete":
            continue
        for pk, rep in points:
            if pk == k:
                row = fixed.copy()
                for i, n in measured:
                    if n in rep:
                        row[i] = rep[n]
                rows.append(row)
                seeds.append(seed)
                break
    return np.array(rows or [fixed], dtype=float), seeds or None


def exact_columns(rows: np.ndarray, values: Mapping[str, float], objectives: list[Objective]) -> np.ndarray:
    """``rows`` (:func:`replicate_rows`, read before every cost-model value was known) with
    each cost-model objective's column set to its exact value in ``values``."""
    out = rows.copy()
    for i, o in enumerate(objectives):
        if not o.measured:
            out[:, i] = values[o.name]
    return out


def replicates_of(record: TrialRecord) -> list[tuple[int, str, list[tuple[int | None, dict]]]]:
    """A record's replicates as :func:`replicate_rows` reads them."""
    return [(r.seed, r.status, [(p.k, p.values) for p in r.points]) for r in record.replicates]


def quality_name(objectives: list[Objective]) -> str | None:
    return next((o.name for o in objectives if o.quality), None)


@dataclass(frozen=True)
class Ranking:
    """The front of N points: ``front`` their indices in :func:`in_cost_order`, each point's
    ``p_front`` (0 for one that cannot reach the front; None for all where no point has two
    replicates), and for each member, in front order, ``tied`` (within seed noise of a
    neighbour; None: unknown) and ``pairs`` (its test against the next member)."""

    front: list[int]
    p_front: list[float | None]
    tied: list[bool | None]
    pairs: list[PairTest | None]


def rank(values: Sequence[Mapping[str, float]], reps: list[np.ndarray], seeds: list[list[int] | None],
         objectives: list[Objective]) -> Ranking:
    """The front of the points whose objective ``values`` (replicate means, finite),
    replicate rows and seeds (:func:`replicate_rows`) are given, in trial-number order.
    Only the points that can reach the front (``nas.noise.front_candidates``) are ranked
    and resampled, 1,000 draws however many points: a point's p_front does not depend on
    how many dominated points the experiment holds."""
    if not values:
        return Ranking([], [], [], [])
    directions = [o.direction for o in objectives]
    near = front_candidates(reps, directions, seeds=seeds)
    matrix = np.array([[values[i][o.name] for o in objectives] for i in near], dtype=float)
    members = in_cost_order(near[non_dominated(matrix, directions)].tolist(), objectives, lambda i: values[i])
    probs: list[float | None] = [None] * len(values)
    if max(len(r) for r in reps) > 1:  # noise known somewhere: every point has a p_front
        some = p_front([reps[i] for i in near], directions, draws=1000, seeds=[seeds[i] for i in near])
        probs = [0.0] * len(values)
        for i, p in zip(near, some):
            probs[i] = float(p)
    quality = quality_name(objectives)
    if quality is None or len(members) < 2:
        return Ranking(members, probs, [None] * len(members), [None] * len(members))
    column = [o.name for o in objectives].index(quality)
    samples = [_samples(reps[i], seeds[i], column) for i in members]
    pairs = [compare(samples[i][0], samples[i + 1][0], samples[i][1], samples[i + 1][1])
             for i in range(len(members) - 1)]
    apart = [p.separated() for p in pairs]
    tied = []
    for i in range(len(members)):
        near_pairs = [apart[j] for j in (i - 1, i) if 0 <= j < len(apart)]
        tied.append(None if any(t is None for t in near_pairs) else not all(near_pairs))
    return Ranking(members, probs, tied, [*pairs, None])


def non_dominated(values, directions: list[str]) -> np.ndarray:
    """``nas.pareto.pareto_front`` (its dominance: no worse in every objective, better in
    one; duplicates all kept), the same indices, by a sort (two objectives) or a sweep
    instead of every pair (``nas.noise.front_candidates`` of single replicates is the front
    itself): the front of every front this package computes."""
    values = np.asarray(values, dtype=float)
    if not len(values):
        return np.zeros(0, dtype=int)
    if values.shape[1] != 2:
        return np.sort(front_candidates([v[None] for v in values], directions))
    f = values * np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    o = np.lexsort((f[:, 1], f[:, 0]))
    x, y = f[o, 0], f[o, 1]
    start = np.r_[True, x[1:] != x[:-1]]  # groups of equal x, each sorted by y
    first = np.flatnonzero(start)
    group = np.cumsum(start) - 1
    before = np.r_[np.inf, np.minimum.accumulate(y)[first[1:] - 1]]  # least y at a smaller x
    return np.sort(o[~((before[group] <= y) | (y[first][group] < y))])


def _samples(reps: np.ndarray, seeds: list[int] | None, column: int) -> tuple[list[float], list[int] | None]:
    values = reps[:, column].tolist()
    return values, (seeds if seeds is not None and len(seeds) == len(values) else None)


def front(records: list[TrialRecord], objectives: list[Objective]) -> list[FrontPoint]:
    """The non-dominated points of the replicate means of ``records`` (:func:`rank`), in
    cost order, each with its ``p_front`` and ``tied`` flag."""
    names = [o.name for o in objectives]
    points, reps, seeds = [], [], []
    for r in records:
        if r.status != "complete":
            continue
        for p in r.points:
            if finite_values(p.values, names):
                rows, s = replicate_rows(replicates_of(r), p.k, objectives, p.values)
                points.append(FrontPoint(r.id, p.k, p.values, r.summary, dict(p.se), p.n))
                reps.append(rows)
                seeds.append(s)
    ranked = rank([p.values for p in points], reps, seeds, objectives)
    return [replace(points[i], p_front=ranked.p_front[i], tied=t, next_pair=pair)
            for i, t, pair in zip(ranked.front, ranked.tied, ranked.pairs)]


def noise_sentence(members: list[FrontPoint], quality: str | None, seeds: int) -> str:
    """One plain sentence: whether the front's quality differences are beyond seed noise."""
    if quality is None or not members:
        return ""
    if seeds < 2 or all(m.n < 2 for m in members):
        return ("Seed noise is unknown: every point is one training run. Rerun with --seeds 3 "
                "(or proxy.seeds: 3), or run loopnas calibrate on the space, before reading "
                "differences on this front as real.")
    if len(members) == 1:
        return f"The front has one member (the mean of {members[0].n} seeds): nothing on it to compare."
    pairs = [m.next_pair for m in members[:-1] if m.next_pair is not None]
    apart = sum(p.separated() is True for p in pairs)
    paired = all(p.paired for p in pairs)
    how = (f"{'paired' if paired else 'Welch'} t-test p < {TIE_ALPHA:g}, {members[0].n} seeds"
           + ("" if paired else ": seeds not shared, replicates treated as independent"))
    if apart == 0:
        return (f"The front's {quality} differences are within seed noise: no two neighbouring "
                f"members differ beyond it ({how}).")
    tied = len(pairs) - apart
    if tied == 0:
        return (f"Every neighbouring pair on the front ({len(pairs)}) differs in {quality} beyond seed "
                f"noise ({how}).")
    return (f"{apart} of {len(pairs)} neighbouring pairs on the front differ in {quality} beyond "
            f"seed noise ({how}); {tied} {'is' if tied == 1 else 'are'} within it.")


__all__ = ["FrontPoint", "Ranking", "all_points", "cost_key", "cost_objectives", "finite_values", "front",
           "in_cost_order", "non_dominated", "noise_sentence", "quality_name", "rank", "replicate_rows", "replicates_of"]
