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
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ParetoHalving:
    """``costs`` are oriented lower-is-better; ``quality`` higher-is-better."""

    rungs: tuple[int, ...]
    margin: float = 0.0
    min_beaten_by: int = 1
    table: dict[int, dict[str, tuple[tuple[float, ...], float]]] = field(default_factory=dict)

    def record(self, trial: str, step: int, costs: tuple[float, ...], quality: float) -> None:
        self.table.setdefault(step, {})[trial] = (tuple(costs), quality)

    def beaten_by(self, trial: str, step: int) -> list[str]:
        """The trials at this rung that cost no more than ``trial`` and beat it by the margin."""
        here = self.table.get(step, {})
        costs, quality = here[trial]
        return [other for other, (c, q) in here.items()
                if other != trial and all(a <= b for a, b in zip(c, costs)) and q > quality + self.margin]

    def decide(self, trial: str, step: int, costs: tuple[float, ...], quality: float | None) -> bool:
        """Record the trial at ``step``; True if it should stop here."""
        if quality is None or step not in self.rungs:
            return False
        self.record(trial, step, costs, quality)
        return len(self.beaten_by(trial, step)) >= self.min_beaten_by


__all__ = ["ParetoHalving"]
