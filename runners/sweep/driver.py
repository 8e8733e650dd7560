"""The sweep driver shared by both engines: one experiment directory and its study.

Whichever engine runs the trials (local worker processes, Ray Tune, a one-shot search),
the driver alone asks and tells the study and writes the experiment directory, so every
engine produces the same results. :class:`Sweep` is the facade the engines use; its parts:

- :mod:`.study`: the Optuna study (ask, tell, constraints, a shared study's budget, recovery);
- :mod:`.gate`: the verdict on a sampled candidate: priced, deduplicated, feasible, or refused
  as ``infeasible`` (it never reaches a worker); a canonical spec already trained (same
  hash) is recorded as ``duplicate`` and reuses the first result;
- :mod:`.scheduler`: replicate jobs (one per seed), their queue and the out-of-memory rerun;
- :mod:`.recorder`: the experiment directory and the trial records.
"""
from __future__ import annotations

import time
from collections import ChainMap
from pathlib import Path

from nas.errors import SpecError
from nas.space import Space, cost_value, grid_size
from runners.checkpoint import LinkError
from runners.results.front import front
from runners.results.records import (
    JOURNAL, TRIALS, Objective, Point, RecordError, Replicate, Rung, TrialRecord, read_experiment, read_trials,
)
from runners.results.status import FINAL, SHOWN, Status
from runners.track import Tracking, mark_front, wanted

from .gate import gate
from .job import Job
from .lock import LockError
from .outcome import Outcome
from .preflight import preflight
from .recorder import (
    APPENDED, OWN, ExperimentDir, Recorder, as_duplicate, concluded, mean_points, mean_rungs, replicate_fields,
    reusable,
)
from .scheduler import Scheduler
from .stopping import ParetoHalving
from .study import RESUME, StudyAdapter, SweepError, make_sampler, record_id


def check_proxy(space: Space) -> None:
    """The space's proxy as the trainer will read it (:func:`.preflight.preflight`)."""
    try:
        preflight({**space.spec.proxy.trainer(), "seed": space.spec.search.seed}, ("proxy",), str(space.source))
    except SpecError as exc:
        raise SweepError(str(exc)) from None


def check_start(space: Space, engine: str) -> None:
    """What would fail every trial, refused before anything is written: a local sweep's CPUs
    per trial beyond the machine's (:func:`nas.space.local_problem`), and a Python space
    whose ``sample()`` raises on its first call (on a throwaway in-memory trial)."""
    import optuna

    from nas.space import local_problem

    problem = local_problem(space.spec) if engine == "optuna" else None
    if problem is not None:
        raise SweepError(f"{space.source}: {problem}")
    if engine == "optuna" and space.spec.search.resources.gpu > 0:
        from .devices import DevicePool, PoolError

        try:  # the visible GPUs hold a trial (the pool checks it again as it starts)
            DevicePool.from_env(space.spec.search.resources.gpu)
        except PoolError as exc:
            raise SweepError(str(exc)) from None
    if space.sample_fn is None:
        return
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=space.spec.search.seed)).ask()
    try:
        space.suggest(trial)
    except SpecError as exc:
        raise SweepError(f"{exc.problems[0].render(str(space.source))} on its first call, before any trial; "
                         "fix sample(), then run again") from None


def proxy_config(space: Space) -> dict:
    """The space's proxy as trainer settings (without the sweep's own fields)."""
    return space.spec.proxy.trainer()


def space_seeds(space: Space) -> int:
    """Replicates per candidate: ``proxy.seeds`` (default 1)."""
    return space.spec.proxy.seeds


class Sweep:
    """One experiment directory and its study; see the module docstring.

    With ``seeds`` > 1 every candidate (one Optuna trial, one record) is trained as that
    many replicate jobs (seeds ``search.seed + i``, the same eval batches); the candidate
    ends when all of them have, and the study is told their mean.

    An engine drives it with :meth:`next_job` (a job to run, or None), :meth:`on_rung` (a
    replicate's evaluation: go on?) and :meth:`on_outcome` (a replicate ended), then
    :meth:`end` (the budget is spent) or :meth:`interrupted`, and :meth:`close`."""

    def __init__(self, space: Space, out: str | Path, engine: str, trials: int | None = None,
                 resume: bool = False, seeds: int | None = None, planned: list[dict] | None = None,
                 track: list[str] | None = None):
        self.dir, self.tracking = ExperimentDir(space, Path(out)), Tracking()
        try:
            self._setup(space, engine, trials, resume, seeds, planned)
        except BaseException as exc:
            self.dir.abandon()
            if isinstance(exc, (LockError, RecordError, LinkError)):
                raise SweepError(str(exc)) from None
            raise
        # search.track and --track: logged here, by the one writer (runners.track)
        self.tracking = Tracking(self.out, wanted(space.spec.search.track, track))
        self.tracking.on_start(read_experiment(self.out), resume)

    def _setup(self, space: Space, engine: str, trials: int | None, resume: bool, seeds: int | None,
               planned: list[dict] | None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        check_proxy(space)
        check_start(space, engine)
        self.space, self.out, self.engine = space, self.dir.out, engine
        spec = space.spec
        self.objectives = [Objective(name=o.name, direction=o.direction, measured=o.measured,
                                     serving=o.serving) for o in spec.objectives]
        self.quality = next((o for o in spec.objectives if o.quality), None)
        self.total = trials or spec.search.trials
        self.seeds = seeds or space_seeds(space)
        self.final = FINAL
        if spec.search.sampler.lower() == "grid" and space.sample_fn is None:
            self.total = min(self.total, grid_size(space) or self.total)
            self.final = (*FINAL, Status.INFEASIBLE)
        if planned is not None:  # a fixed design (calibration): its points are the budget
            self.total, self.final = len(planned), (*FINAL, Status.INFEASIBLE)
        self.dir.open(resume, self.objectives, engine, self.total, self.seeds)
        # read before the study is touched: a damaged record refuses a resume with nothing written
        self.recorder = Recorder(self.out, read_trials(self.out), self.final)
        if resume:
            self.dir.resumed_folders(self.records)
        self.study_adapter = StudyAdapter(space, self.out, self.objectives, self.total, self.final)
        self.study, self.where = self.study_adapter.study, self.study_adapter.where
        if planned is not None and not resume:
            self.study_adapter.plan(planned)
        self.by_hash = {r.spec_hash: r.id for r in self.records.values() if reusable(r) and r.spec_hash}
        self.scheduler = Scheduler(space, self.out, self.seeds)
        self.infeasible_streak = 0
        self._sheets: dict[str, dict] = {}  # record id → its cost sheets by context
        self.stopper = self._stopper()
        if resume:
            self.study_adapter.recover(self.records)

    def _stopper(self) -> ParetoHalving | None:
        """Pareto-aware early stopping (``search.early_stopping``), told every rung already
        recorded (a resumed sweep)."""
        es = self.space.spec.search.early_stopping
        if not es:
            return None
        margin = es.margin if es.margin is not None else ("auto" if self.seeds > 1 else 0.0)
        stopper = ParetoHalving(es.rungs, margin, es.min_beaten_by)
        for r in self.records.values():
            for i, rep in enumerate(r.replicates or [Replicate(index=0, seed=r.seed, rungs=r.rungs)]):
                for rung in rep.rungs:
                    if r.arch is not None and rung.quality is not None and rung.step in es.rungs:
                        stopper.record(r.id, rung.step, self._cost_key(r), self._oriented(rung.quality), replicate=i)
        return stopper

    @property
    def records(self) -> dict[str, TrialRecord]:
        """Every trial record by id, as written (:class:`.recorder.Recorder`)."""
        return self.recorder.records

    @records.setter
    def records(self, records: dict[str, TrialRecord]) -> None:  # a watcher of the writes (the progress line)
        self.recorder.records = records

    @property
    def active(self) -> set[str]:
        """Candidates with replicates still to finish."""
        return self.scheduler.active

    @property
    def queue(self) -> list[Job]:
        """Replicate jobs waiting for a worker."""
        return self.scheduler.queue

    @queue.setter
    def queue(self, jobs: list[Job]) -> None:
        self.scheduler.queue = jobs

    def budget_used(self) -> int:
        """Trials that use the budget: finished ones and those in flight in this driver
        (both counted as they change, not by reading every record). Infeasible candidates
        cost nothing and do not count, except on a grid, whose budget is its points. On a
        shared RDB (``search.storage``) the study's trials are counted, whichever driver
        runs them: ``trials: N`` is N for the whole study."""
        if self.study_adapter.shared:
            return self.study_adapter.used()
        return self.recorder.settled + self.scheduler.in_flight()

    def wants_more(self) -> bool:
        return self.budget_used() < self.total and self.infeasible_streak < 50 * self.total

    def counts(self) -> dict[str, int]:
        """Trials by status (:data:`SHOWN`), those left running by an interruption left out."""
        out = dict.fromkeys(SHOWN, 0)
        for r in self.records.values():
            if r.status == Status.RUNNING and r.id not in self.active and not r.duplicate_of:
                continue  # interrupted, queued again
            out[r.status] += 1
        return out

    def next_job(self) -> Job | None:
        """The next replicate job to run: a queued one, else ask the study until a candidate
        must be trained (every engine takes its jobs here). None: the budget is spent and
        nothing is queued."""
        while not self.queue and self.wants_more():
            trial = self.study_adapter.ask()
            if trial is not None:
                self.queue.extend(self.gate(trial))
        job = self.scheduler.take()
        if job is not None:
            self.recorder.update_replicate(job.trial, job.replicate, status=Status.RUNNING.value, started=time.time())
        return job

    def gate(self, trial) -> list[Job]:
        """Gate a sampled trial (:func:`.gate.gate`) and act on the verdict. Returns its
        replicate jobs to train (those not already complete, on a resume), or none when the
        trial was settled here (infeasible, or a duplicate)."""
        rid = record_id(trial)
        record = TrialRecord(id=rid, number=trial.number, status=Status.RUNNING.value,
                             seed=self.space.spec.search.seed, started=time.time())
        running = {self.records[i].spec_hash: i for i in self.active}
        verdict = gate(self.space, trial, record, ChainMap(self.by_hash, running))
        record = verdict.record
        if verdict.sheets:
            self._sheets[rid] = verdict.sheets
        self.study_adapter.constrain(trial, verdict.violated)
        if verdict.refused:
            self.infeasible_streak += 1
            self._record_and_tell(trial, record, None)
            return []
        self.infeasible_streak = 0
        if verdict.duplicate_of is not None and verdict.duplicate_of not in self.active:
            original = self.records[verdict.duplicate_of]
            self._record_and_tell(trial, as_duplicate(record, original), original)
            return []
        if verdict.duplicate_of is not None:  # of a candidate still training: settled with it
            self.scheduler.await_original(record.spec_hash, trial, rid)
            self.recorder.write(record.model_copy(update={"duplicate_of": verdict.duplicate_of}))
            return []
        resume = bool(trial.user_attrs.get(RESUME))
        replicates = self.scheduler.replicates(self.records.get(rid) if resume else None)
        record = self.recorder.write(record.model_copy(update={"replicates": replicates,
                                                               "rungs": mean_rungs(replicates)}))
        jobs = self.scheduler.admit(trial, record, verdict.config, resume)
        if not jobs:  # every replicate finished before the interruption
            self._candidate_ended(rid)
        return jobs

    def _cost_value(self, record: TrialRecord, objective, k: int | None = None) -> float:
        """A cost-model objective of a trial (at loop count ``k``), priced from its sheets."""
        return cost_value(self._arch(record), objective.metric, objective.seq_len or self.space.spec.seq_len,
                          k=k, sheets=self._sheets.setdefault(record.id, {}))

    def _cost_key(self, record: TrialRecord) -> tuple[float, ...]:
        """The cost objectives of a trial, oriented lower-is-better."""
        out = []
        for o in self.space.spec.objectives:
            if not o.measured:
                value = self._cost_value(record, o)
                out.append(value if o.direction == "minimize" else -value)
        return tuple(out)

    def _arch(self, record: TrialRecord):
        from nas.spec import stored_spec

        return stored_spec(record.arch)

    def _oriented(self, quality: float) -> float:
        return quality if self.quality is None or self.quality.direction == "maximize" else -quality

    def on_rung(self, job_id: str, rung: Rung) -> bool:
        """Record a replicate's rung; False: stop it here (Pareto-aware early stopping, or its
        candidate already ended through another replicate)."""
        job = self.scheduler.running.get(job_id)
        if job is None:
            return False  # a late result of a trial already settled
        rid, index = job.trial, job.replicate
        if rid in self.scheduler.ended:
            return False
        # a run resumed from a checkpoint reports its steps again from there
        kept = [r for r in self.records[rid].replicates[index].rungs if r.step < rung.step]
        record = self.recorder.update_replicate(rid, index, rungs=[*kept, rung])
        if self.stopper is None or record.arch is None or record.arch.get("elastic"):
            return True  # an elastic trial yields a whole curve: it is never stopped
        quality = None if rung.quality is None else self._oriented(rung.quality)
        if self.stopper.decide(rid, rung.step, self._cost_key(record), quality, replicate=index):
            self.scheduler.end(rid, {"status": Status.PRUNED.value, "reason": f"stopped early at step {rung.step}"})
            return False
        return True

    def points(self, record: TrialRecord, measured) -> list[Point]:
        """One point per evaluated loop count (elastic), else one: every objective's value
        (quality from the proxy, serving metrics as the trial measured them at that loop
        count, cost-model values priced at it). ``measured``: an outcome's."""
        elastic = [m for m in measured if m.k is not None]
        out = []
        for m in elastic or measured:
            values = {}
            for o in self.space.spec.objectives:
                if o.quality:
                    values[o.name] = float(m.value)
                elif o.serving:
                    values[o.name] = float(m.serving[o.name])
                else:
                    values[o.name] = self._cost_value(record, o, k=m.k)
            out.append(Point(k=m.k, values=values))
        return out

    def on_outcome(self, job_id: str, outcome: Outcome | dict) -> None:
        """A replicate ended (``outcome``: an :class:`.outcome.Outcome`, or its plain data):
        record it; once every replicate of its candidate has ended, the candidate ends
        (:meth:`_candidate_ended`). A replicate that fails, times out or is stopped ends its
        candidate the same way."""
        job = self.scheduler.running.pop(job_id, None)
        if job is None:
            return
        outcome = Outcome.of(outcome)
        rid, index = job.trial, job.replicate
        record = self.records[rid]
        rep = record.replicates[index]
        if outcome.status == Status.OOM and self.scheduler.retry_alone(job, outcome.share):
            self.recorder.update_replicate(rid, index, status=Status.QUEUED.value, retried=outcome.reason,
                                           devices=list(outcome.devices) or rep.devices,
                                           peak_memory=outcome.peak_memory)
            return
        points = self.points(record, outcome.measured) if outcome.status == Status.COMPLETE else []
        record = self.recorder.update_replicate(rid, index, **replicate_fields(outcome, rep, points))
        self.tracking.on_replicate(record, index)
        if outcome.status != Status.COMPLETE:
            who = f"replicate {index} (seed {rep.seed}): " if self.seeds > 1 else ""
            self.scheduler.end(rid, {"status": outcome.status, "reason": who + (outcome.reason or outcome.status),
                                     "crashed": outcome.crashed})
        if self.scheduler.idle(rid):
            self._candidate_ended(rid)

    def _candidate_ended(self, rid: str) -> None:
        """Every replicate of ``rid`` has ended: record and tell the candidate's outcome, and
        settle the duplicates that waited for it."""
        trial, ended = self.scheduler.settle(rid)
        record = concluded(self.records[rid], ended)
        self._record_and_tell(trial, record, None)
        if reusable(record):
            self.by_hash[record.spec_hash] = rid  # deterministic outcomes: a duplicate would repeat them
        for dup in self.scheduler.waiting.pop(record.spec_hash, []):
            self._record_and_tell(self.scheduler.trials.pop(dup), as_duplicate(self.records[dup], record), record)

    def _record_and_tell(self, trial, record: TrialRecord, original: TrialRecord | None) -> None:
        """Write the settled record, tell the study (a duplicate: as ``original`` ended) and
        the trackers."""
        self.recorder.write(record)
        self.study_adapter.tell(trial, record, original, self._cost_value)
        self.tracking.on_candidate(record)

    def end(self, report: Path | None = None) -> None:
        """The budget is spent: the front, computed once, on the study (each member's
        p_front) and to the trackers, with the report where one was written."""
        members = front(list(self.records.values()), self.objectives)
        mark_front(self.study, members, self.records)
        self.tracking.on_end(members, report)

    def interrupted(self) -> None:
        """The driver is stopping early: active trials stay ``running`` for --resume (the
        directory is released)."""
        self.close()
        self.scheduler.clear()

    def abandon_unstarted(self) -> bool:
        """The sweep failed before its first trial (a pool or a Ray cluster that cannot start):
        a new experiment is removed as if never started (:meth:`.recorder.ExperimentDir.abandon`);
        True if so."""
        if not self.dir.wrote or self.records or any((self.out / TRIALS).glob("t*.json")):
            return False
        if not self.dir.retake():  # released by the engine: take it again, or leave it to its holder
            return False
        self.dir.abandon()
        self.tracking.close()
        return True

    def close(self) -> None:
        """The sweep has ended (finished, failed or interrupted): another driver may resume it."""
        self.tracking.close()
        self.dir.release()


def default_out(space: Space) -> Path:
    """``runs/<space name>``, never outside ``runs/`` (:func:`nas.spec.named_path`)."""
    from nas.spec import named_path

    return named_path("runs", space.name)


__all__ = ["Sweep", "SweepError", "check_proxy", "check_start", "make_sampler", "mean_points", "mean_rungs",
           "proxy_config", "space_seeds", "default_out", "APPENDED", "OWN", "JOURNAL"]
