"""The experiment read-model: one experiment directory as ``status``, the report and
export's ``--pick`` read it. Records → candidates (trials, with their replicates) → their
points (an elastic trial has one per loop count) → the front (in cost order, with p_front,
ties, the knee and the noise sentence: :func:`runners.results.front.rank`) → a candidate's
checkpoint (:func:`runners.results.records.checkpoint_of`).

Each reader decides which points it can rank (status: every complete point with a finite
value for every objective; the report: those with a usable cost sheet; export: those with
a spec) and this module ranks them, one way. Torch-free; no plotting or terminal library."""
from __future__ import annotations

import math
import os
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from nas.noise import PairTest, front_candidates

from . import records
from .front import (
    FrontPoint, exact_columns, finite_values, noise_sentence, quality_name, rank, replicate_rows, replicates_of,
)
from .records import (
    TRIALS, ExperimentRecord, Objective, TrialRecord, Unreadable, brief, digest_rungs, iter_index, read_experiment,
    read_record, read_trials, trial_path, undigest,
)


@dataclass(frozen=True, slots=True)
class TrialPoint:
    """One point of a complete trial: its objectives' replicate means (``values``), standard
    errors (``se``; missing: unknown) and replicate count; on the front, its noise. Slotted:
    a report holds one per point, 10,000 and more."""

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
    return [TrialPoint(trial, p.k, p.values, p.se, p.n) for p in trial.points if finite_values(p.values, names)]


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
    rungs: dict[str, array] | None = None  # each trial's rungs by id where trials are digests (rungs_of)

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

    def rank(self, replicates: dict[tuple[str, int | None], ReplicateRows] | None = None) -> Experiment:
        """Rank ``points``: the front, each point's p_front and each member's tie (in place;
        returns the experiment). ``replicates``: each point's replicate rows by (trial id,
        k), where the records hold none (:func:`read_candidates` of digests); else the records'."""
        reps, seeds = [], []
        for p in self.points:
            found = replicates.get((p.trial.id, p.k)) if replicates is not None else None
            if found is None:
                rows, s = replicate_rows(replicates_of(p.trial), p.k, self.objectives, p.values)
            else:
                rows, s = exact_columns(found[0], p.values, self.objectives), found[1]
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

    def rungs_of(self, trial: TrialRecord) -> list[tuple[int, float | None]]:
        """A trial's (step, quality) at each rung: its record's, or where the trials are
        digests, the digest's (:func:`records.digest_rungs`; quality NaN where none)."""
        flat = self.rungs.get(trial.id) if self.rungs is not None else None
        if flat is None:
            return [(r.step, r.quality) for r in trial.rungs]
        return [(int(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

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
ReplicateRows = tuple[np.ndarray, list[int] | None]  # a point's (front.replicate_rows): a few hundred bytes, not 2 kB of lists


def digest_replicates(data: dict) -> Replicates:
    """A :func:`records.digest`'s replicates as :func:`replicate_rows` reads them (its
    ``"reps"`` without their indices): the digest-side twin of ``replicates_of``."""
    return [(seed, status, points) for _, seed, status, points in data["reps"]]


@dataclass
class Candidates:
    """What :func:`read_candidates` read: every readable trial record (or its digest), each
    canonical spec's problem by trial id (``records.arch_problem``), what was unreadable
    (named, not fatal); from digests, each point's replicate rows by (trial id, k) and each
    trial's rungs by id (:meth:`Experiment.rank`, :meth:`Experiment.rungs_of`; None: in
    the records)."""

    trials: list[TrialRecord]
    bad: dict[str, str]
    unreadable: list[Unreadable]
    replicates: dict[tuple[str, int | None], ReplicateRows] | None = None
    rungs: dict[str, array] | None = None


def read_candidates(exp_dir: str | Path, whole: bool, objectives: list[Objective]) -> Candidates:
    """The trial records (``whole``), else their digests (``records.iter_index``:
    incremental, one parsed at a time, and no spec, replicate rungs or replicate records in
    memory: each point's replicates over ``objectives`` become their rows, each trial's
    rungs a flat array)."""
    problems: list[Unreadable] = []
    if whole:
        trials = read_trials(exp_dir, problems=problems)
        return Candidates(trials, {t.id: records.arch_problem(t.arch) for t in trials if t.status == "complete"},
                          problems)

    def use(d: dict) -> tuple:  # raises on a digest that is not one (iter_index reads its record again)
        d = brief(d)
        trial = undigest(d, more=True, replicates=False, rungs=False)
        reps, replicates = {}, digest_replicates(d)
        for p in trial.points:  # cost-model columns: set at rank time, where a cost sheet may add them
            known = {o.name: p.values.get(o.name, math.nan) for o in objectives}
            reps[p.k] = replicate_rows(replicates, p.k, objectives, known)
        return trial, str(d["more"].get("arch_problem", "")), digest_rungs(d), reps

    out = Candidates([], {}, problems, {}, {})
    for trial, bad, rungs, reps in iter_index(exp_dir, problems=problems, more=True, use=use):  # one at a time
        out.trials.append(trial)
        out.bad[trial.id] = bad
        out.rungs[trial.id] = rungs
        out.replicates.update({(trial.id, k): r for k, r in reps.items()})
    out.trials.sort(key=lambda t: t.number)
    return out


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


__all__ = ["Candidates", "Experiment", "ReplicateRows", "Replicates", "TrialPoint", "WHOLE", "from_digests", "load", "points_of", "read_candidates",
           "trial_files"]
