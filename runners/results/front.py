"""The current front of an experiment: every point of every complete trial (an elastic
trial contributes one point per loop count), ranked by ``nas.pareto`` on replicate means,
with each point's seed noise (``nas.noise``): its standard errors, its probability of being
on the front (a bootstrap paired by seed), and whether a front member is within noise of its
neighbours (``nas.noise.compare``: a paired t-test over shared seeds at
``nas.noise.TIE_ALPHA``, Welch's where seeds are not shared)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from nas.noise import TIE_ALPHA, PairTest, compare, p_front
from nas.pareto import pareto_front

from .records import Objective, TrialRecord


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


def replicate_rows(record: TrialRecord, k: int | None, objectives: list[Objective],
                   values: dict[str, float]) -> np.ndarray:
    """``(n, M)``: one row per complete replicate of ``record`` at loop count ``k``, its
    measured objectives as it measured them and the rest from ``values`` (known exactly).
    A record without replicates gives the one row ``values``."""
    rows = []
    for rep in record.replicates:
        point = next((p for p in rep.points if p.k == k), None)
        if rep.status == "complete" and point is not None:
            rows.append([point.values.get(o.name, values[o.name]) if o.measured else values[o.name]
                         for o in objectives])
    return np.array(rows or [[values[o.name] for o in objectives]], dtype=float)


def replicate_seeds(record: TrialRecord, k: int | None) -> list[int] | None:
    """The seed of each row :func:`replicate_rows` gives (None: a record without replicates)."""
    seeds = [rep.seed for rep in record.replicates
             if rep.status == "complete" and any(p.k == k for p in rep.points)]
    return seeds or None


def front_probabilities(reps: list[np.ndarray], directions: list[str],
                        seeds: list[list[int] | None] | None = None) -> list[float | None]:
    """``nas.noise.p_front`` of each point (paired by seed where every point shares its seeds),
    or None for all when no point has two replicates. 1,000 draws however many points: the
    bootstrap resamples only the points that can reach the front, so a point's p_front does
    not depend on how many dominated points the experiment holds."""
    if not reps or max(len(r) for r in reps) < 2:
        return [None] * len(reps)
    return p_front(reps, directions, draws=1000, seeds=seeds).tolist()


def quality_name(objectives: list[Objective]) -> str | None:
    return next((o.name for o in objectives if o.quality), None)


def mark_ties(members: list[FrontPoint], quality: str | None,
              samples: list[tuple[list[float], list[int] | None]]) -> list[FrontPoint]:
    """Members (in cost order) with ``next_pair`` (the test against the next member) and
    ``tied`` set: within seed noise of a neighbour. ``samples[i]``: member i's replicate
    qualities and their seeds."""
    if quality is None or len(members) < 2:
        return members
    pairs = [compare(samples[i][0], samples[i + 1][0], samples[i][1], samples[i + 1][1])
             for i in range(len(members) - 1)]
    apart = [p.separated() for p in pairs]
    out = []
    for i, m in enumerate(members):
        near = [apart[j] for j in (i - 1, i) if 0 <= j < len(apart)]
        tied = None if any(t is None for t in near) else not all(near)
        out.append(replace(m, tied=tied, next_pair=pairs[i] if i < len(pairs) else None))
    return out


def _samples(reps: np.ndarray, seeds: list[int] | None, column: int) -> tuple[list[float], list[int] | None]:
    values = reps[:, column].tolist()
    return values, (seeds if seeds is not None and len(seeds) == len(values) else None)


def front(records: list[TrialRecord], objectives: list[Objective]) -> list[FrontPoint]:
    """The non-dominated points of the replicate means, sorted by :func:`cost_key`, each
    with its ``p_front`` and ``tied`` flag."""
    by_id = {r.id: r for r in records}
    points = [p for p in all_points(records)
              if all(o.name in p.values and math.isfinite(p.values[o.name]) for o in objectives)]
    if not points:
        return []
    directions = [o.direction for o in objectives]
    reps = [replicate_rows(by_id[p.trial], p.k, objectives, p.values) for p in points]
    seeds = [replicate_seeds(by_id[p.trial], p.k) for p in points]
    probs = front_probabilities(reps, directions, seeds)
    values = [[p.values[o.name] for o in objectives] for p in points]
    key = cost_key(objectives)
    idx = sorted(pareto_front(values, directions), key=lambda i: points[i].values[key])
    members = [replace(points[i], p_front=probs[i]) for i in idx]
    quality = quality_name(objectives)
    if quality is None:
        return members
    column = [o.name for o in objectives].index(quality)
    return mark_ties(members, quality, [_samples(reps[i], seeds[i], column) for i in idx])


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


__all__ = ["FrontPoint", "all_points", "cost_key", "cost_objectives", "front", "front_probabilities", "mark_ties",
           "noise_sentence", "quality_name", "replicate_rows", "replicate_seeds"]
