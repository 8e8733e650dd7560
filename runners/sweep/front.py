"""The current front of an experiment: every point of every complete trial (an elastic
trial contributes one point per loop count), ranked by ``nas.pareto``."""
from __future__ import annotations

import math
from dataclasses import dataclass

from nas.pareto import pareto_front

from .records import Objective, TrialRecord


@dataclass(frozen=True)
class FrontPoint:
    trial: str
    k: int | None
    values: dict[str, float]
    summary: str | None


def all_points(records: list[TrialRecord]) -> list[FrontPoint]:
    """Points of complete trials (duplicates add nothing: they repeat their original)."""
    return [FrontPoint(r.id, p.k, p.values, r.summary)
            for r in records if r.status == "complete" for p in r.points]


def cost_key(objectives: list[Objective]) -> str:
    """The objective a front is ordered by: the first cost-model objective, else the first
    serving cost, else the first objective."""
    costs = [o for o in objectives if not o.measured] + [o for o in objectives if o.serving]
    return (costs or objectives)[0].name


def front(records: list[TrialRecord], objectives: list[Objective]) -> list[FrontPoint]:
    """The non-dominated points, sorted by :func:`cost_key`."""
    points = [p for p in all_points(records)
              if all(o.name in p.values and math.isfinite(p.values[o.name]) for o in objectives)]
    if not points:
        return []
    values = [[p.values[o.name] for o in objectives] for p in points]
    members = [points[i] for i in pareto_front(values, [o.direction for o in objectives])]
    key = cost_key(objectives)
    return sorted(members, key=lambda p: p.values[key])


__all__ = ["FrontPoint", "all_points", "cost_key", "front"]
