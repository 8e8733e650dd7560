"""What a report shows, computed from an experiment directory; no plotting here.

A *row* is one point of a ``complete`` trial: a plain trial gives one, an elastic trial one
per evaluated loop count ``k``. The front is taken over the experiment's objectives (all of
them, in their directions) with :mod:`nas.pareto`; the charts also draw the 2-D front of
quality against each cost axis.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from nas.cost import COST_FIELDS, sheet_value
from nas.noise import kendall_tau
from nas.pareto import hypervolume, knee_point, pareto_front
from runners.sweep.front import (
    FrontPoint, front_probabilities, mark_ties, noise_sentence, replicate_rows, replicate_seeds,
)
from runners.sweep.records import (
    ExperimentRecord, Objective, TrialRecord, Unreadable, read_experiment, read_trials,
)


@dataclass(frozen=True)
class Row:
    """One (quality, cost) point of a complete trial, with its cost sheet at ``k``."""

    trial: TrialRecord
    k: int | None
    values: dict[str, float]  # every objective, by name (replicate means)
    sheet: dict  # the cost sheet's figures at k (and unique_params)
    se: dict[str, float] = field(default_factory=dict)  # standard errors; missing: unknown
    n: int = 1  # replicates
    p_front: float | None = None  # probability of being on the front (None: noise unknown)
    tied: bool | None = None  # a front member within seed noise of a neighbour

    @property
    def label(self) -> str:
        return self.trial.id if self.k is None else f"{self.trial.id} k={self.k}"

    @property
    def summary(self) -> str:
        return self.trial.summary or (self.trial.arch or {}).get("name", "?")

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


@dataclass
class Experiment:
    record: ExperimentRecord
    trials: list[TrialRecord]
    seq_len: int
    rows: list[Row] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)  # why a complete trial's point is left out
    front: list[int] = field(default_factory=list)  # indices into rows
    knee: int | None = None  # index into rows
    noise: str = ""  # one sentence: are the front's differences beyond seed noise?
    dir: Path | None = None  # the experiment directory

    @property
    def objectives(self) -> list[Objective]:
        return self.record.objectives

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def quality(self) -> Objective:
        """The y-axis: the proxy's quality objective (the first objective if there is none,
        e.g. serving costs against cost-model ones)."""
        return next((o for o in self.objectives if o.quality), self.objectives[0])

    @property
    def counts(self) -> Counter:
        return Counter(t.status for t in self.trials)

    def matrix(self, rows: list[Row] | None = None) -> np.ndarray:
        rows = self.rows if rows is None else rows
        return np.array([[r.values[o.name] for o in self.objectives] for r in rows], dtype=float)


def _sheet_at(cost: dict, k: int | None) -> dict:
    """The cost sheet's figures at elastic loop count ``k`` (the spec's own loops if None)."""
    figures = cost
    if k is not None and str(k) in cost.get("per_k", {}):
        figures = cost["per_k"][str(k)]
    return {**figures, "unique_params": cost["unique_params"],
            "train_flops_per_token": cost.get("train_flops_per_token")}


def _reprice(trial: TrialRecord, seq_len: int) -> dict | None:
    """The trial's cost sheet at another context (or a missing one), from its canonical spec."""
    if trial.arch is None:
        return trial.cost
    from nas.cost import cost
    from nas.spec import ArchSpec
    dtype = (trial.cost or {}).get("dtype", "bf16")
    return cost(ArchSpec.model_validate(trial.arch), seq_len=seq_len, dtype=dtype).to_dict()


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


def _bad_arch(trial: TrialRecord) -> str:
    """Why the trial's canonical spec does not validate (the report draws and reprices it), or ''."""
    if trial.arch is None:
        return ""
    from pydantic import ValidationError

    from nas.spec import ArchSpec
    try:
        ArchSpec.model_validate(trial.arch)
    except (ValidationError, ValueError, TypeError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
        where = ".".join(map(str, first["loc"])) or "the top level"
        return f"arch is not a valid spec: {where}: {first['msg']}"
    return ""


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
        values = dict(p.values)
        for o in objectives:
            if o.name not in values and o.name in COST_FIELDS:  # cost objectives the sheet has
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
        rows.append(Row(trial, p.k, values, sheet, dict(p.se), p.n))
    return rows, excluded


def _read_trials(exp_dir: str | Path) -> tuple[list[TrialRecord], list[str]]:
    """Every readable trial record; an unreadable one is named, not fatal (the one reader:
    :func:`runners.sweep.records.read_trials`)."""
    problems: list[Unreadable] = []
    trials = read_trials(exp_dir, problems=problems)
    return trials, [f"{p.path.name}: unreadable record ({p.why})" for p in problems]


def load(exp_dir: str | Path, seq_len: int | None = None) -> Experiment:
    """Read an experiment directory (finished or still running) and rank its points.

    ``seq_len`` reprices every trial's cost sheet (the memory axis, the front table) at
    another context from its canonical spec; objective values stay as the sweep recorded
    them. By default the sheets are taken as written, at the experiment's context.
    """
    record = read_experiment(exp_dir)
    trials, unreadable = _read_trials(exp_dir)
    exp = Experiment(record, trials, seq_len or record.seq_len, excluded=unreadable, dir=Path(exp_dir))
    for trial in exp.trials:
        if trial.status != "complete":
            continue
        why = _bad_arch(trial)
        if why:
            exp.excluded.append(f"{trial.id}: {why}")
            continue
        same = exp.seq_len == record.seq_len and trial.cost is not None
        cost = trial.cost if same else _reprice(trial, exp.seq_len)
        rows, excluded = _rows(trial, exp.objectives, cost)
        exp.rows += rows
        exp.excluded += excluded
    if exp.rows:
        values = exp.matrix()
        exp.front = pareto_front(values, exp.directions).tolist()
        exp.knee = exp.front[knee_point(values[exp.front], exp.directions)]
        _noise(exp)
    return exp


def _noise(exp: Experiment) -> None:
    """Each row's p_front, the front members' ties and the noise sentence (runners.sweep.front)."""
    reps = [replicate_rows(r.trial, r.k, exp.objectives, r.values) for r in exp.rows]
    seeds = [replicate_seeds(r.trial, r.k) for r in exp.rows]
    probs = front_probabilities(reps, exp.directions, seeds)
    order = sorted(exp.front, key=lambda i: (exp.rows[i].compute, exp.rows[i].label))
    column = [o.name for o in exp.objectives].index(exp.quality.name)
    members = mark_ties([FrontPoint(exp.rows[i].label, exp.rows[i].k, exp.rows[i].values, None,
                                    exp.rows[i].se, exp.rows[i].n) for i in order], exp.quality.name,
                        [(reps[i][:, column].tolist(), seeds[i]) for i in order])
    tied = {i: m.tied for i, m in zip(order, members)}
    exp.rows = [replace(r, p_front=probs[i], tied=tied.get(i)) for i, r in enumerate(exp.rows)]
    exp.noise = noise_sentence(members, exp.quality.name if exp.quality.quality else None,
                               exp.record.seeds)


def front_2d(exp: Experiment, x: str, direction: str = "minimize") -> list[int]:
    """Indices of rows on the front of quality against ``x`` (a :meth:`Row.get` key: a cost
    axis, minimised, or a serving objective in its ``direction``), ordered by ``x``."""
    if not exp.rows:
        return []
    q = exp.quality
    values = [[r.values[q.name], r.get(x)] for r in exp.rows]
    front = pareto_front(values, [q.direction, direction]).tolist()
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
    by_trial = np.array([r.trial.id for r in exp.rows])
    minimise = ["minimize"] * len(signs)
    history, front = [], np.empty((0, len(signs)))
    for trial in completion_order(exp):
        # the front so far plus the new points dominates what all points so far dominate
        front = np.vstack([front, scaled[by_trial == trial.id]])
        front = front[pareto_front(front, minimise)]
        history.append((trial.id, hypervolume(front, minimise, np.ones(len(signs)))))
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
        for rung in t.rungs:
            if rung.quality is not None and math.isfinite(rung.quality):
                by_step.setdefault(rung.step, {})[t.id] = rung.quality
    out = []
    for step in sorted(by_step):
        ids = sorted(by_step[step])
        if len(ids) >= 3:
            tau = kendall_tau([by_step[step][i] for i in ids], [final[i] for i in ids])
            out.append(Agreement(step, tau, len(ids)))
    return out


__all__ = ["Agreement", "Experiment", "Row", "completion_order", "front_2d",
           "hypervolume_history", "kendall_tau", "load", "rank_agreement"]
