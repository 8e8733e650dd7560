"""What a report shows, computed from an experiment directory; no plotting here.

A *row* is one point of a ``complete`` trial: a plain trial gives one, an elastic trial one
per evaluated loop count ``k``. The front is taken over the experiment's objectives (all of
them, in their directions) with :mod:`nas.pareto`; the charts also draw the 2-D front of
quality against each cost axis.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from nas.cost import COST_FIELDS, sheet_value
from nas.noise import front_candidates, kendall_tau, p_front
from nas.pareto import hypervolume, knee_point, pareto_front
from runners.results.front import (
    FrontPoint, mark_ties, noise_sentence, replicate_rows, replicate_seeds,
)
from runners.results.records import (
    TRIALS, ExperimentRecord, Objective, TrialRecord, Unreadable, arch_problem, read_experiment, read_index,
    read_record, read_trials, trial_path, undigest,
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
    return arch_problem(trial.arch)


def non_dominated(values, directions: list[str]) -> np.ndarray:
    """``nas.pareto.pareto_front`` of many points: the same indices, by a sort (two
    objectives) or a sweep instead of every pair (``nas.noise.front_candidates`` of single
    replicates is the front itself)."""
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


def _read_trials(exp_dir: str | Path, full: bool) -> tuple[list[TrialRecord], dict[str, str], list[str]]:
    """Every readable trial record, each canonical spec's problem by trial id, and what was
    unreadable, named, not fatal. ``full``: the records themselves (their specs are
    repriced); else their digests (``runners.results.records.read_index``: incremental, and
    no spec or replicate rungs in memory)."""
    problems: list[Unreadable] = []
    if full:
        trials = read_trials(exp_dir, problems=problems)
        bad = {t.id: _bad_arch(t) for t in trials if t.status == "complete"}
    else:
        digests = read_index(exp_dir, problems=problems, more=True)
        trials = [undigest(d, more=True) for d in digests]
        bad = {d["id"]: d["more"].get("arch_problem", "") for d in digests}
    return trials, bad, [f"{p.path.name}: unreadable record ({p.why})" for p in problems]


def load(exp_dir: str | Path, seq_len: int | None = None) -> Experiment:
    """Read an experiment directory (finished or still running) and rank its points.

    ``seq_len`` reprices every trial's cost sheet (the memory axis, the front table) at
    another context from its canonical spec; objective values stay as the sweep recorded
    them. By default the sheets are taken as written, at the experiment's context. Past
    :data:`WHOLE` trials (and not repricing) the records are read as their digests
    (``runners.results.records.read_index``): a row's ``trial`` has no spec or replicate
    rungs, except on the front, whose trials are read whole (diagrams, rung metrics).
    """
    record = read_experiment(exp_dir)
    reprice = seq_len is not None and seq_len != record.seq_len
    full = reprice or _trial_files(Path(exp_dir)) <= WHOLE
    trials, bad, unreadable = _read_trials(exp_dir, full)
    exp = Experiment(record, trials, seq_len or record.seq_len, excluded=unreadable, dir=Path(exp_dir))
    for trial in exp.trials:
        if trial.status != "complete":
            continue
        if bad.get(trial.id):
            exp.excluded.append(f"{trial.id}: {bad[trial.id]}")
            continue
        cost = _reprice(trial, exp.seq_len) if reprice else trial.cost
        rows, excluded = _rows(trial, exp.objectives, cost)
        exp.rows += rows
        exp.excluded += excluded
    if exp.rows:
        _noise(exp)
        values = exp.matrix()
        exp.knee = exp.front[knee_point(values[exp.front], exp.directions)]
        if not full:
            _whole(exp)
    return exp


WHOLE = 2000  # trials up to which the report reads every record whole


def _trial_files(exp_dir: Path) -> int:
    try:
        return sum(1 for e in os.scandir(exp_dir / TRIALS) if e.name.startswith("t") and e.name.endswith(".json"))
    except OSError:
        return 0


def _whole(exp: Experiment) -> None:
    """The front's rows with their whole trial records (spec, rung metrics) in place of digests."""
    whole: dict[str, TrialRecord] = {}
    for i in exp.front:
        tid = exp.rows[i].trial.id
        if tid not in whole:
            rec, _ = read_record(trial_path(exp.dir, tid), TrialRecord)
            whole[tid] = rec if rec is not None else exp.rows[i].trial
        exp.rows[i] = replace(exp.rows[i], trial=whole[tid])


def _noise(exp: Experiment) -> None:
    """The front, each row's p_front, the front members' ties and the noise sentence
    (runners.results.front). Only the rows that can reach the front are resampled and ranked
    (``nas.noise.front_candidates``); every other row's p_front is 0."""
    reps = [replicate_rows(r.trial, r.k, exp.objectives, r.values) for r in exp.rows]
    seeds = [replicate_seeds(r.trial, r.k) for r in exp.rows]
    near = front_candidates(reps, exp.directions, seeds=seeds)
    exp.front = near[pareto_front(exp.matrix()[near], exp.directions)].tolist()  # the front of the means is near
    probs: list[float | None] = [None] * len(exp.rows)
    if max(len(r) for r in reps) > 1:  # noise known somewhere: every row has a p_front
        some = p_front([reps[i] for i in near], exp.directions, draws=1000, seeds=[seeds[i] for i in near])
        probs = [0.0] * len(exp.rows)
        for i, p in zip(near, some):
            probs[i] = float(p)
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


def _tau(x: list[float], y: list[float]) -> float:
    """``nas.noise.kendall_tau`` (τ-b); past 500 trials scipy's O(n log n) τ-b, not every pair."""
    if len(x) <= 500:
        return kendall_tau(x, y)
    from scipy import stats
    return float(stats.kendalltau(x, y, variant="b").statistic)


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
            tau = _tau([by_step[step][i] for i in ids], [final[i] for i in ids])
            out.append(Agreement(step, tau, len(ids)))
    return out


__all__ = ["Agreement", "Experiment", "Row", "completion_order", "front_2d",
           "hypervolume_history", "kendall_tau", "load", "non_dominated", "rank_agreement"]
