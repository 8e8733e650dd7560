"""The current front of an experiment: every point of every complete trial (an elastic
trial contributes one point per loop count), ranked by ``nas.pareto`` on replicate means,
with each point's seed noise (``nas.noise``): its standard errors, its probability of being
on the front, and whether a front member is within noise of its neighbours."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from nas.noise import Z, p_front, tied_neighbours
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


def front_probabilities(reps: list[np.ndarray], directions: list[str]) -> list[float | None]:
    """``nas.noise.p_front`` of each point, or None for all when no point has two replicates."""
    if not reps or max(len(r) for r in reps) < 2:
        return [None] * len(reps)
    draws = 1000 if len(reps) <= 100 else max(100, 100_000 // len(reps))
    return p_front(reps, directions, draws=draws).tolist()


def quality_name(objectives: list[Objective]) -> str | None:
    return next((o.name for o in objectives if o.quality), None)


def mark_ties(members: list[FrontPoint], quality: str | None) -> list[FrontPoint]:
    """Members (in cost order) with ``tied`` set: within seed noise of a neighbour."""
    if quality is None or len(members) < 2:
        return members
    q = [m.values[quality] for m in members]
    se = [m.se.get(quality, math.nan) for m in members]
    pairs = tied_neighbours(q, se, Z)
    out = []
    for i, m in enumerate(members):
        near = [pairs[j] for j in (i - 1, i) if 0 <= j < len(pairs)]
        tied = None if any(t is None for t in near) else any(near)
        out.append(replace(m, tied=tied))
    return out


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
    probs = front_probabilities(reps, directions)
    values = [[p.values[o.name] for o in objectives] for p in points]
    members = [replace(points[i], p_front=probs[i]) for i in pareto_front(values, directions)]
    key = cost_key(objectives)
    return mark_ties(sorted(members, key=lambda p: p.values[key]), quality_name(objectives))


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
    q = [m.values[quality] for m in members]
    se = [m.se.get(quality, math.nan) for m in members]
    pairs = tied_neighbours(q, se, Z)
    apart = sum(t is False for t in pairs)
    if apart == 0:
        return (f"The front's {quality} differences are within seed noise: no two neighbouring "
                f"members differ by more than {Z:g} combined standard errors ({members[0].n} seeds).")
    tied = len(pairs) - apart
    if tied == 0:
        return (f"Every neighbouring pair on the front ({len(pairs)}) differs in {quality} beyond seed "
                f"noise (> {Z:g} combined standard errors, {members[0].n} seeds).")
    return (f"{apart} of {len(pairs)} neighbouring pairs on the front differ in {quality} beyond "
            f"seed noise (> {Z:g} combined standard errors, {members[0].n} seeds); "
            f"{tied} {'is' if tied == 1 else 'are'} within it.")


__all__ = ["FrontPoint", "all_points", "cost_key", "cost_objectives", "front", "front_probabilities", "mark_ties",
           "noise_sentence", "quality_name", "replicate_rows"]
