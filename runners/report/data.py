"""What a report shows, computed from an experiment directory; no plotting here.

The experiment is the read-model's (:mod:`runners.results.experiment`: its points, front,
knee and noise); the report adds each point's cost sheet (a *row*: one point of a
``complete`` trial whose cost sheet it can draw, an elastic trial one per evaluated loop
count ``k``), the 2-D front of quality against each cost axis, the hypervolume as trials
complete and the rank agreement of the rungs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nas.cost import sheet_value
from nas.metrics import COST_METRICS
from nas.noise import kendall_tau
from nas.pareto import hypervolume, pareto_front
from runners.results import experiment
from runners.results.experiment import TrialPoint, WHOLE, read_candidates, trial_files
from runners.results.front import non_dominated
from runners.results.records import Objective, TrialRecord, read_experiment


@dataclass(frozen=True, slots=True)
class Row(TrialPoint):
    """One (quality, cost) point of a complete trial, with its cost sheet at ``k``."""

    sheet: dict = field(default_factory=dict)  # the cost sheet's figures at k (and unique_params)

    @property
    def compute(self) -> float:
        return float(self.sheet["projection_flops_per_token"])

    @property
    def params(self) -> float:
        return float(self.sheet["unique_params"])

    @property
    def memory(self) -> float:
        """Inference memory per sequence: KV cache plus recurrent state."""
        return float(self.sheet["kv_cache_bytes"] + self.sheet["state_bytes"])

    def error(self, name: str) -> float:
        """The standard error of objective ``name`` (0 when unknown or exact)."""
        return float(self.se.get(name, 0.0))

    def get(self, key: str) -> float:
        """A cost axis (``compute``, ``params``, ``memory``) or an objective's value by name."""
        if key in ("compute", "params", "memory"):
            return getattr(self, key)
        return float(self.values[key])


class Experiment(experiment.Experiment):
    """The read-model as the report draws it: its points are :class:`Row` s."""

    @property
    def rows(self) -> list[Row]:
        return self.points  # type: ignore[return-value]


def _sheet_at(cost: dict, k: int | None) -> dict:
    """The cost sheet's figures at elastic loop count ``k`` (the spec's own loops if None)."""
    figures = cost
    if k is not None and str(k) in cost.get("per_k", {}):
        figures = cost["per_k"][str(k)]
    if figures is cost and "train_flops_per_token" in cost:
        return cost  # the sheet itself (not a copy for each of 10,000 rows)
    return {**figures, "unique_params": cost["unique_params"],
            "train_flops_per_token": cost.get("train_flops_per_token")}


def _reprice(trial: TrialRecord, seq_len: int) -> dict | None:
    """The trial's cost sheet at another context (or a missing one), from its canonical spec."""
    if trial.arch is None:
        return trial.cost
    from nas.cost import cost
    from nas.spec import stored_spec
    dtype = (trial.cost or {}).get("dtype", "bf16")
    return cost(stored_spec(trial.arch), seq_len=seq_len, dtype=dtype).to_dict()


# the cost sheet's figures a row reads, at every loop count; unique_params only at the top
FIGURES = ("projection_flops_per_token", "forward_flops_per_token", "kv_cache_bytes", "state_bytes")


def _count(x: object) -> bool:
    """A cost sheet's figure: a finite, non-negative number."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _bad_sheet(cost: dict) -> str:
    """Why ``cost`` is not a cost sheet the report can draw, or ''."""
    per_k = cost.get("per_k", {})
    if not isinstance(per_k, dict) or not all(isinstance(v, dict) for v in per_k.values()):
        return "per_k is not a table of cost sheets"
    for where, figures in [("", cost)] + [(f"per_k.{k}.", v) for k, v in per_k.items()]:
        for name in FIGURES + (("unique_params",) if not where else ()):
            if not _count(figures.get(name)):
                return f"{where}{name} = {figures.get(name)!r}"
    train = cost.get("train_flops_per_token")
    return "" if train is None or _count(train) else f"train_flops_per_token = {train!r}"


def _rows(trial: TrialRecord, objectives: list[Objective], cost: dict | None) -> tuple[list[Row], list[str]]:
    rows, excluded = [], []
    if cost is None:
        return rows, [f"{trial.id}: no cost sheet"]
    why = _bad_sheet(cost)
    if why:
        return rows, [f"{trial.id}: unusable cost sheet ({why})"]
    if not trial.points:
        return rows, [f"{trial.id}: complete but no evaluated points"]
    for p in trial.points:
        sheet = _sheet_at(cost, p.k)
        values = p.values  # the record's (copied only where the sheet adds an objective)
        for o in objectives:
            if o.name not in values and o.name in COST_METRICS:  # cost objectives the sheet has
                values = values if values is not p.values else dict(values)
                try:
                    values[o.name] = sheet_value(cost, o.name, p.k if str(p.k) in cost.get("per_k", {}) else None)
                except (KeyError, TypeError, ValueError):  # a field the sheet lacks: named below
                    pass
        label = trial.id if p.k is None else f"{trial.id} k={p.k}"
        missing = [o.name for o in objectives if o.name not in values]
        bad = [o.name for o in objectives if o.name in values and not math.isfinite(values[o.name])]
        if missing or bad:
            excluded.append(f"{label}: " + "; ".join(
                [f"no {n}" for n in missing] + [f"{n} = {values[n]}" for n in bad]))
            continue
        rows.append(Row(trial, p.k, values, p.se, p.n, sheet=sheet))
    return rows, excluded


def load(exp_dir: str | Path, seq_len: int | None = None) -> Experiment:
    """Read an experiment directory (finished or still running) and rank its points.

    ``seq_len`` reprices every trial's cost sheet (the memory axis, the front table) at
    another context from its canonical spec; objective values stay as the sweep recorded
    them. By default the sheets are taken as written, at the experiment's context. Past
    :data:`~runners.results.experiment.WHOLE` trials (and not repricing) the records are
    read as their digests (``runners.results.records.read_index``): a row's ``trial`` has no
    spec or replicate rungs, except on the front, whose trials are read whole (diagrams,
    rung metrics).
    """
    record = read_experiment(exp_dir)
    reprice = seq_len is not None and seq_len != record.seq_len
    whole = reprice or trial_files(Path(exp_dir)) <= WHOLE
    read = read_candidates(exp_dir, whole, record.objectives)
    exp = Experiment(record, read.trials, excluded=[f"{p.path.name}: unreadable record ({p.why})"
                                                    for p in read.unreadable],
                     dir=Path(exp_dir), seq_len=seq_len or record.seq_len, rungs=read.rungs)
    for trial in exp.trials:
        if trial.status != "complete":
            continue
        if read.bad.get(trial.id):
            exp.excluded.append(f"{trial.id}: {read.bad[trial.id]}")
            continue
        cost = _reprice(trial, exp.seq_len) if reprice else trial.cost
        rows, excluded = _rows(trial, exp.objectives, cost)
        exp.points += rows
        exp.excluded += excluded
    exp.rank(read.replicates)
    if not whole:
        exp.read_whole(exp.front)
    return exp


def front_2d(exp: Experiment, x: str, direction: str = "minimize") -> list[int]:
    """Indices of rows on the front of quality against ``x`` (a :meth:`Row.get` key: a cost
    axis, minimised, or a serving objective in its ``direction``), ordered by ``x``."""
    if not exp.rows:
        return []
    q = exp.quality
    values = [[r.values[q.name], r.get(x)] for r in exp.rows]
    front = non_dominated(values, [q.direction, direction]).tolist()
    return sorted(front, key=lambda i: (exp.rows[i].get(x), exp.rows[i].label))


def completion_order(exp: Experiment) -> list[TrialRecord]:
    """Complete trials with ranked rows, in the order they finished."""
    ranked = {r.trial.id for r in exp.rows}
    done = [t for t in exp.trials if t.id in ranked]
    return sorted(done, key=lambda t: (t.finished is None, t.finished or 0.0, t.number))


def hypervolume_history(exp: Experiment) -> list[tuple[str, float]]:
    """(trial id, hypervolume of every point so far) after each completed trial.

    Each objective is scaled by the box from the best value over all points to a
    reference 10% beyond the worst, so the hypervolume is the share of that box dominated
    (0 to 1) and the last value does not depend on the objectives' units.
    """
    if not exp.rows:
        return []
    signs = np.array([1.0 if d == "minimize" else -1.0 for d in exp.directions])
    f = exp.matrix() * signs
    best, worst = f.min(axis=0), f.max(axis=0)
    span = np.where(worst > best, worst - best, 1.0)
    scaled = (f - best) / (1.1 * span)  # reference at 1.0
    by_trial: dict[str, list[int]] = {}
    for i, r in enumerate(exp.rows):
        by_trial.setdefault(r.trial.id, []).append(i)
    minimise = ["minimize"] * len(signs)
    history, front, hv = [], np.empty((0, len(signs))), 0.0
    for trial in completion_order(exp):
        # incremental: the front so far plus the new points dominates what all points so far
        # dominate, and only a point that joins the front changes the hypervolume
        new = scaled[by_trial[trial.id]]
        joins = [not ((front <= p).all(1) & (front < p).any(1)).any() for p in new]
        if any(joins):
            front = np.vstack([front, new[joins]])
            front = front[pareto_front(front, minimise)]
            hv = hypervolume(front, minimise, np.ones(len(signs)))
        history.append((trial.id, hv))
    return history


@dataclass(frozen=True)
class Agreement:
    step: int
    tau: float
    trials: int


def rank_agreement(exp: Experiment) -> list[Agreement]:
    """Kendall τ between each rung's quality and the final quality, over the complete
    trials evaluated at that rung (final: the trial's quality at its own loop count).
    τ near 1 means ranking at that rung would have picked the same architectures; τ is NaN
    at a rung where every trial has the same quality."""
    q = exp.quality.name
    final = {}
    for t in completion_order(exp):
        if q in t.values and math.isfinite(t.values[q]):
            final[t.id] = t.values[q]
    by_step: dict[int, dict[str, float]] = {}
    for t in exp.trials:
        if t.id not in final:
            continue
        for step, quality in exp.rungs_of(t):
            if quality is not None and math.isfinite(quality):
                by_step.setdefault(step, {})[t.id] = quality
    out = []
    for step in sorted(by_step):
        ids = sorted(by_step[step])
        if len(ids) >= 3:
            tau = kendall_tau([by_step[step][i] for i in ids], [final[i] for i in ids])
            out.append(Agreement(step, tau, len(ids)))
    return out


__all__ = ["Agreement", "Experiment", "Row", "WHOLE", "completion_order", "front_2d",
           "hypervolume_history", "kendall_tau", "load", "non_dominated", "rank_agreement"]
