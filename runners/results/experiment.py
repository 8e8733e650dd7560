"""The experiment read-model: one experiment directory as ``status``, the report and
export's ``--pick`` read it. Records → candidates (trials, with their replicates) → their
points (an elastic trial has one per loop count) → the front (in cost order, with p_front,
ties, the knee and the noise sentence: :func:`runners.results.front.rank`) → a candidate's
checkpoint (:func:`runners.results.records.checkpoint_of`).

Each reader decides which points it can rank (status: every complete point with a finite
value for every objective; the report: those with a usable cost sheet; export: those with
a spec) and this module ranks them, one way. Torch-free; no plotting or terminal library."""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from nas.noise import PairTest, front_candidates

from . import records
from .front import (
    FrontPoint, finite_values, noise_sentence, quality_name, rank, replicate_rows, replicates_of,
)
from .records import (
    TRIALS, ExperimentRecord, Objective, TrialRecord, Unreadable, read_experiment, read_index, read_record,
    read_trials, trial_path, undigest,
)


@dataclass(frozen=True)
class TrialPoint:
    """One point of a complete trial: its objectives' replicate means (``values``), standard
    errors (``se``; missing: unknown) and replicate count; on the front, its noise."""

    trial: TrialRecord  # the candidate: its whole record, or its digest (no spec, no replicate rungs)
    k: int | None  # the loop count an elastic checkpoint was evaluated at (None: the spec's own)
    values: dict[str, float]
    se: dict[str, float] = field(default_factory=dict)
    n: int = 1
    p_front: float | None = None  # probability of being on the front (None: noise unknown)
    tied: bool | None = None  # a front member within seed noise of a neighbour (None: unknown)
    next_pair: PairTest | None = None  # a front member's test against the next in cost order

    @property
    def label(self) -> str:
        return self.trial.id if self.k is None else f"{self.trial.id} k={self.k}"

    @property
    def summary(self) -> str:
        return self.trial.summary or (self.trial.arch or {}).get("name", "?")

    def front_point(self) -> FrontPoint:
        return FrontPoint(self.trial.id, self.k, self.values, self.trial.summary, self.se, self.n,
                          self.p_front, self.tied, self.next_pair)

    def entry(self, objectives: list[Objective]) -> dict:
        """The point as plain data, as ``loopnas status --json`` lists a front member: each
        objective's standard error 0 for cost-model values and None when unknown."""
        return {"trial": self.trial.id, "k": self.k, "values": self.values,
                "se": {o.name: self.se.get(o.name) if o.measured else 0.0 for o in objectives},
                "n": self.n, "p_front": self.p_front, "tied": self.tied, "summary": self.trial.summary}


def points_of(trial: TrialRecord, objectives: list[Objective]) -> list[TrialPoint]:
    """The points of a complete trial with a finite value for every objective."""
    if trial.status != "complete":
        return []
    names = [o.name for o in objectives]
    return [TrialPoint(trial, p.k, p.values, dict(p.se), p.n) for p in trial.points if finite_values(p.values, names)]


@dataclass
class Experiment:
    """An experiment as read: its record, its candidates, their ranked points and the front
    of those (``front``: indices into ``points`` in cost order; ``knee``: an index into
    ``points``), after :meth:`rank`."""

    record: ExperimentRecord
    trials: list[TrialRecord] = field(default_factory=list)  # the candidates read (see the loaders)
    points: list[TrialPoint] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)  # why a point (or a record) is left out
    front: list[int] = field(default_factory=list)
    knee: int | None = None
    noise: str = ""  # one sentence: are the front's differences beyond seed noise?
    dir: Path | None = None
    seq_len: int | None = None  # the context the cost sheets are priced at (the experiment's by default)

    def __post_init__(self) -> None:
        if self.seq_len is None:
            self.seq_len = self.record.seq_len

    @property
    def objectives(self) -> list[Objective]:
        return self.record.objectives

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def quality(self) -> Objective:
        """The proxy's quality objective (the first objective if there is none, e.g. serving
        costs against cost-model ones)."""
        return next((o for o in self.objectives if o.quality), self.objectives[0])

    @property
    def counts(self) -> Counter:
        return Counter(t.status for t in self.trials)

    @property
    def members(self) -> list[TrialPoint]:
        """The front's points, in cost order."""
        return [self.points[i] for i in self.front]

    def matrix(self, points: list[TrialPoint] | None = None) -> np.ndarray:
        points = self.points if points is None else points
        return np.array([[p.values[o.name] for o in self.objectives] for p in points], dtype=float)

    def front_entries(self) -> list[dict]:
        """The front as plain data (:meth:`TrialPoint.entry`): status's JSON and the terminal table."""
        return [p.entry(self.objectives) for p in self.members]

    def rank(self, replicates: dict[str, Replicates] | None = None) -> Experiment:
        """Rank ``points``: the front, each point's p_front and each member's tie (in place;
        returns the experiment). ``replicates``: each trial's by id, where the records hold
        none (:func:`read_candidates` of digests); else the records'."""
        reps, seeds = [], []
        for p in self.points:
            found = replicates_of(p.trial) if replicates is None else replicates.get(p.trial.id, [])
            rows, s = replicate_rows(found, p.k, self.objectives, p.values)
            reps.append(rows)
            seeds.append(s)
        ranked = rank([p.values for p in self.points], reps, seeds, self.objectives)
        self.points = [replace(p, p_front=ranked.p_front[i]) for i, p in enumerate(self.points)]
        for i, tied, pair in zip(ranked.front, ranked.tied, ranked.pairs):
            self.points[i] = replace(self.points[i], tied=tied, next_pair=pair)
        self.front = ranked.front
        self.knee = self._knee()
        self.noise = noise_sentence(self.members, quality_name(self.objectives), self.record.seeds)
        return self

    def _knee(self) -> int | None:
        from nas.pareto import knee_point

        if not self.front:
            return None
        ascending = sorted(self.front)  # knee_point breaks ties by the lowest index
        return ascending[knee_point(self.matrix([self.points[i] for i in ascending]), self.directions)]

    def trial(self, trial_id: str) -> TrialRecord:
        found = next((t for t in self.trials if t.id == trial_id), None)
        if found is None:
            raise records.RecordError(f"no trial {trial_id!r} in {self.dir}")
        return found

    def checkpoint_of(self, candidate: str | TrialRecord | TrialPoint, replicate: int | None = None) -> Path:
        """The trainer checkpoint of a candidate (by id, record or point), or of one of its
        replicates (:func:`runners.results.records.checkpoint_of`)."""
        record = candidate.trial if isinstance(candidate, TrialPoint) else candidate
        return records.checkpoint_of(self.dir, self.trial(record) if isinstance(record, str) else record, replicate)

    def read_whole(self, indices: list[int]) -> None:
        """The points at ``indices`` with their trials' whole records (spec, rung metrics) in
        place of digests; a record that cannot be read again keeps its digest."""
        whole: dict[str, TrialRecord] = {}
        for i in indices:
            tid = self.points[i].trial.id
            if tid not in whole:
                rec, _ = read_record(trial_path(self.dir, tid), TrialRecord)
                whole[tid] = rec if rec is not None else self.points[i].trial
            self.points[i] = replace(self.points[i], trial=whole[tid])


WHOLE = 2000  # trials up to which the records are read whole rather than as their digests


def trial_files(exp_dir: Path) -> int:
    try:
        return sum(1 for e in os.scandir(Path(exp_dir) / TRIALS) if e.name.startswith("t") and e.name.endswith(".json"))
    except OSError:
        return 0


Replicates = list[tuple[int, str, list]]  # (seed, status, [(k, values), ...]) of each: front.replicate_rows reads them


def digest_replicates(data: dict) -> Replicates:
    """A :func:`records.digest`'s replicates as :func:`replicate_rows` reads them (its
    ``"reps"`` without their indices): the digest-side twin of ``replicates_of``."""
    return [(seed, status, points) for _, seed, status, points in data["reps"]]


def read_candidates(exp_dir: str | Path, whole: bool) -> tuple[list[TrialRecord], dict[str, str], list[Unreadable],
                                                               dict[str, Replicates] | None]:
    """Every readable trial record, each canonical spec's problem by trial id
    (``records.arch_problem``), what was unreadable (named, not fatal) and the replicates
    by trial id (None: in the records). ``whole``: the records themselves; else their
    digests (``records.read_index``: incremental, and no spec, replicate rungs or
    replicate records in memory: each trial's replicates stay the digest's plain lists,
    for :meth:`Experiment.rank`, and each digest is let go once read)."""
    problems: list[Unreadable] = []
    if whole:
        trials = read_trials(exp_dir, problems=problems)
        return trials, {t.id: records.arch_problem(t.arch) for t in trials if t.status == "complete"}, problems, None
    digests = read_index(exp_dir, problems=problems, more=True)
    trials, bad, reps = [], {}, {}
    for n, d in enumerate(digests):
        digests[n] = None  # type: ignore[call-overload]  # freed as read: the records reuse its memory
        trials.append(undigest(d, more=True, replicates=False))
        bad[d["id"]] = d["more"].get("arch_problem", "")
        reps[d["id"]] = digest_replicates(d)
    return trials, bad, problems, reps


def load(exp_dir: str | Path, admit: Callable[[TrialRecord], bool] | None = None) -> Experiment:
    """The experiment with every readable record whole, the points of its complete trials
    (those ``admit`` lets in) ranked. An unreadable trial record is skipped and named in
    ``excluded``."""
    problems: list[Unreadable] = []
    trials = read_trials(exp_dir, problems=problems)
    exp = Experiment(read_experiment(exp_dir), trials, excluded=[str(p) for p in problems], dir=Path(exp_dir))
    exp.points = [p for t in trials if admit is None or admit(t) for p in points_of(t, exp.objectives)]
    return exp.rank()


def from_digests(exp_dir: str | Path, record: ExperimentRecord, digests: list[dict]) -> Experiment:
    """The front of an experiment from its records' digests (``records.read_index``), as
    status needs it at 10,000 candidates: only the candidates whose points can reach the
    front (every other is dominated in every draw of the p_front bootstrap:
    ``nas.noise.front_candidates``) are made records again and ranked, so the front and its
    p_front are those of all. ``trials`` and ``points`` hold only those candidates."""
    names = [o.name for o in record.objectives]
    owners, reps, seeds = [], [], []
    for n, d in enumerate(digests):
        if d["status"] != "complete":
            continue
        for p in d["points"]:
            if finite_values(p["values"], names):
                rows, s = replicate_rows(digest_replicates(d),
                                         p["k"], record.objectives, p["values"])
                owners.append(n)
                reps.append(rows)
                seeds.append(s)
    near = front_candidates(reps, [o.direction for o in record.objectives], seeds=seeds) if reps else []
    trials = [undigest(digests[n]) for n in sorted({owners[i] for i in near})]
    exp = Experiment(record, trials, dir=Path(exp_dir))
    exp.points = [p for t in trials for p in points_of(t, record.objectives)]
    return exp.rank()


__all__ = ["Experiment", "Replicates", "TrialPoint", "WHOLE", "from_digests", "load", "points_of", "read_candidates",
           "trial_files"]
