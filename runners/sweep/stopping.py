"""Early stopping that cannot corrupt a Pareto front.

ASHA ranks trials on one metric, so a cheap candidate is stopped for losing to expensive
ones, and the cheap end of the front is lost. Here the cost objectives are known exactly
before training and only quality is measured, which permits a stricter rule: at a rung
(an evaluation at a fixed optimizer step), a trial stops only when at least
``min_beaten_by`` trials that cost no more on every cost objective already beat its quality
at the same rung by more than ``margin``. Such a trial is dominated at that rung by a
trial at least as cheap, so removing it can only remove a point that is (so far) off the
front. Trials arrive asynchronously: each is judged against those that reached the rung
before it, as in asynchronous successive halving.

With seed replicates a trial's quality at a rung is the mean of its replicates that have
reached it, and ``margin="auto"`` replaces the fixed margin by the seed noise: the other
trial must be better by more than ``nas.noise.Z`` combined standard errors, each from the
within-trial variance pooled over every trial with two or more replicates at that rung
(divided by the trial's replicate count there). While no trial has two replicates at a
rung the noise is unknown and nothing stops there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from nas.noise import Z, pooled_variance


@dataclass
class ParetoHalving:
    """``costs`` are oriented lower-is-better; ``quality`` higher-is-better."""

    rungs: tuple[int, ...]
    margin: float | Literal["auto"] = 0.0
    min_beaten_by: int = 1
    # step → trial → (costs, quality per replicate index)
    table: dict[int, dict[str, tuple[tuple[float, ...], dict[int, float]]]] = field(default_factory=dict)

    def record(self, trial: str, step: int, costs: tuple[float, ...], quality: float,
               replicate: int = 0) -> None:
        here = self.table.setdefault(step, {})
        here.setdefault(trial, (tuple(costs), {}))[1][replicate] = quality

    def _mean(self, step: int, trial: str) -> tuple[float, int]:
        values = self.table[step][trial][1].values()
        return sum(values) / len(values), len(values)

    def threshold(self, step: int, n_a: int, n_b: int) -> float:
        """How much better another trial must be: the fixed margin, or (auto) Z combined
        standard errors of two means of ``n_a`` and ``n_b`` replicates."""
        if self.margin != "auto":
            return float(self.margin)
        var = pooled_variance([list(q.values()) for _, q in self.table.get(step, {}).values()])
        return Z * math.sqrt(var / n_a + var / n_b) if math.isfinite(var) else math.inf

    def beaten_by(self, trial: str, step: int) -> list[str]:
        """The trials at this rung that cost no more than ``trial`` and beat it by the margin."""
        here = self.table.get(step, {})
        costs = here[trial][0]
        quality, n = self._mean(step, trial)
        out = []
        for other, (c, _) in here.items():
            if other == trial or not all(a <= b for a, b in zip(c, costs)):
                continue
            q, m = self._mean(step, other)
            if q > quality + self.threshold(step, n, m):
                out.append(other)
        return out

    def decide(self, trial: str, step: int, costs: tuple[float, ...], quality: float | None,
               replicate: int = 0) -> bool:
        """Record a replicate of the trial at ``step``; True if the trial should stop here."""
        if quality is None or step not in self.rungs:
            return False
        self.record(trial, step, costs, quality, replicate)
        return len(self.beaten_by(trial, step)) >= self.min_beaten_by


__all__ = ["ParetoHalving"]
