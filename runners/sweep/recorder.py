"""The experiment directory as a sweep writes it: opened (new, or resumed after the checks
that keep one front honest), its trial records written as they change, and a start that
failed removed again. The one writer of ``EXP/trials/*.json``; it keeps the count of
records whose status uses the budget as it writes them, so asking how much is used costs
the same at 10 trials as at 10,000 (issue #32).

Also the two mappings into records: a worker's :class:`.outcome.Outcome` into its
replicate's fields (:func:`replicate_fields`), and ended replicates into their candidate's
record (:func:`concluded`)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from nas.noise import mean_se
from nas.space import Space, changes, identity
from runners.checkpoint import atomic, run_folder
from runners.results.records import (
    EXPERIMENT, INDEX, INDEX_MORE, JOURNAL, TRIALS, ExperimentRecord, Objective, Point, Replicate, Rung,
    TrialRecord, read_experiment, run_dir, study_storage, trial_path, write_json,
)
from runners.results.status import Status

from .lock import LOCK, acquire
from .outcome import Outcome
from .study import SweepError

# entries of an experiment directory that are appended to or written inside (not replaced
# whole by the atomic write): never through a symlink (ExperimentDir._links). The journal, the
# trial records and runs, the artifact store (runners.track.study.ARTIFACTS), TensorBoard's and
# MLflow's files, Ray's, a one-shot sweep's supernet and its self-check (runners.oneshot.check.CHECK).
APPENDED = (JOURNAL, TRIALS, "artifacts", "tensorboard", "mlartifacts", "ray", "supernet", "check")
# and those written whole, atomically (a link there is replaced anyway): a new experiment
# replaces a link at any of them before it starts
OWN = (*APPENDED, EXPERIMENT, "space.yaml", "space.py", INDEX, INDEX_MORE, "oneshot.json", "tracking.json")


def reusable(record: TrialRecord) -> bool:
    """Whether a finished trial's outcome is the candidate's own (deterministic), so an
    identical candidate would repeat it: not a timeout, not a crash of its process."""
    return record.status in (Status.COMPLETE, Status.PRUNED) or record.status == Status.FAILED and not record.crashed


def mean_points(replicates: list[Replicate]) -> list[Point]:
    """The points of a candidate: per loop count, each objective's mean over replicates and
    its standard error (left out with one replicate: noise unknown)."""
    done = [r.points for r in replicates if r.points]
    out = []
    for i, first in enumerate(done[0] if done else []):
        same = [pts[i] for pts in done]
        values, se = {}, {}
        for name in first.values:
            mean, err = mean_se([p.values[name] for p in same])
            values[name] = mean
            if len(same) > 1:
                se[name] = err
        out.append(Point(k=first.k, values=values, se=se, n=len(same)))
    return out


def mean_rungs(replicates: list[Replicate]) -> list[Rung]:
    """Per evaluated step, the mean quality and metrics of the replicates that reached it."""
    steps = sorted({r.step for rep in replicates for r in rep.rungs})
    out = []
    for step in steps:
        here = [r for rep in replicates for r in rep.rungs if r.step == step]
        q = [r.quality for r in here if r.quality is not None]
        keys = set.intersection(*(set(r.metrics) for r in here))
        out.append(Rung(step=step, tokens=here[0].tokens, quality=sum(q) / len(q) if q else None,
                        metrics={k: sum(r.metrics[k] for r in here) / len(here) for k in sorted(keys)}))
    return out


def replicate_fields(outcome: Outcome, rep: Replicate, points: list[Point]) -> dict:
    """What ``outcome`` makes of the replicate ``rep`` (``points``: a complete run's): the
    one mapping of a worker's answer to a record. Rungs already reported live are kept."""
    return {"status": outcome.status, "reason": outcome.reason, "rungs": rep.rungs or list(outcome.rungs),
            "points": points, "crashed": outcome.crashed, "node": outcome.node,
            "devices": list(outcome.devices) or rep.devices, "ran_on": outcome.ran_on,
            "peak_memory": outcome.peak_memory,
            "started": rep.started if outcome.started is None else outcome.started,
            "finished": time.time() if outcome.finished is None else outcome.finished,
            "wall_time": outcome.wall_time}


def concluded(record: TrialRecord, ended: dict | None) -> TrialRecord:
    """The candidate once every replicate has ended: complete with their mean points, or as
    ``ended`` says (the status and reason of the replicate that ended it), with their mean
    rungs, devices, peak memory and times."""
    reps = record.replicates
    update = {"status": Status.COMPLETE.value, "reason": None, "points": mean_points(reps)} if ended is None \
        else {**ended, "points": []}
    walls = [r.wall_time for r in reps if r.wall_time is not None]
    return record.model_copy(update={
        **update, "rungs": mean_rungs(reps), "node": next((r.node for r in reps if r.node), None),
        "devices": sorted({d for r in reps for d in r.devices}),
        "peak_memory": max((r.peak_memory for r in reps if r.peak_memory is not None), default=None),
        "started": min((r.started for r in reps if r.started), default=record.started),
        "finished": max((r.finished for r in reps if r.finished), default=time.time()),
        "wall_time": sum(walls) if walls else None})


def as_duplicate(record: TrialRecord, original: TrialRecord) -> TrialRecord:
    """``record`` settled as a duplicate of ``original``: its result reused."""
    return record.model_copy(update={
        "status": Status.DUPLICATE.value, "duplicate_of": original.id, "points": original.points,
        "reason": f"same canonical spec as {original.id} ({original.status}); its result is reused",
        "finished": time.time()})


class Recorder:
    """The trial records of one experiment, by id; ``final``: the statuses that use the
    budget, counted as records are written (:attr:`settled`)."""

    def __init__(self, out: Path, records: list[TrialRecord], final: tuple[str, ...]):
        self.out, self.final = out, final
        self.records: dict[str, TrialRecord] = {r.id: r for r in records}
        self.settled = sum(r.status in final for r in records)

    def write(self, record: TrialRecord) -> TrialRecord:
        old = self.records.get(record.id)
        self.settled += (record.status in self.final) - (old is not None and old.status in self.final)
        self.records[record.id] = record
        write_json(trial_path(self.out, record.id), record)
        return record

    def update_replicate(self, rid: str, index: int, **fields) -> TrialRecord:
        """Replicate ``index`` of ``rid`` with ``fields``; the candidate's rungs their mean."""
        record = self.records[rid]
        reps = list(record.replicates)
        reps[index] = reps[index].model_copy(update=fields)
        return self.write(record.model_copy(update={"replicates": reps, "rungs": mean_rungs(reps)}))


class ExperimentDir:
    """The directory a sweep writes, held by its lock from :meth:`open` to :meth:`close`."""

    def __init__(self, space: Space, out: Path):
        self.space, self.out = space, out
        self.lock, self.wrote, self.fresh = None, False, []

    def _links(self, exists: bool) -> None:
        """The entries of the experiment the sweep writes into, never through a symlink: a
        link planted at one (to send what is written there over someone's files) is replaced
        when the experiment is new (the link goes, its target is untouched); an experiment to
        resume holding one is refused in one line (its journal or its records would be
        written outside the directory) (issue #34)."""
        for name in OWN:
            path = self.out / name
            if not path.is_symlink():
                continue
            if not exists:
                path.unlink()
            elif name in APPENDED:
                raise SweepError(f"--resume: {path} is a symbolic link (to {os.readlink(path)}); loopnas writes "
                                 "only inside the experiment directory: put the file or folder itself there, "
                                 "or start a new experiment with another --out")

    def open(self, resume: bool, objectives: list[Objective], engine: str, trials: int, seeds: int) -> None:
        """Take the directory: a new experiment is written (its record, the space file); one
        to resume is checked against the space and seeds it was started with."""
        had_lock = os.path.lexists(self.out / LOCK)
        self.lock = acquire(self.out)  # before anything is read or written: one driver at a time
        self._links((self.out / EXPERIMENT).is_file())
        # what this start creates, and so what a start that fails removes again (nothing else)
        self.fresh = [name for name in (EXPERIMENT, f"space{self.space.source.suffix}", JOURNAL, TRIALS)
                      if not os.path.lexists(self.out / name)] + ([] if had_lock else [LOCK])
        exists = (self.out / EXPERIMENT).is_file()
        if exists and not resume:
            raise SweepError(f"{self.out} already holds an experiment; pass --resume to continue it "
                             "or choose another --out")
        if resume and not exists:
            raise SweepError(f"--resume: {self.out} holds no experiment to resume")
        if resume:
            old = read_experiment(self.out)
            changed = changes(self.space, old.space, old.identity)
            if changed:
                raise SweepError(f"--resume: {self.out} was started with another {', '.join(changed)}; resumed, "
                                 "one front would mix old and new candidates: start a new experiment with "
                                 f"another --out (e.g. --out {self.out}-2), or undo the change")
            if old.seeds != seeds:
                raise SweepError(f"--seeds: {self.out} was started with {old.seeds} seed(s) per candidate; "
                                 f"resume it with --seeds {old.seeds}")
            return
        self.wrote = True
        (self.out / TRIALS).mkdir(parents=True, exist_ok=True)
        with atomic(self.out / f"space{self.space.source.suffix}") as tmp:  # never through a link
            shutil.copyfile(self.space.source, tmp)
        spec, url = self.space.spec, self.space.spec.search.storage
        write_json(self.out / EXPERIMENT, ExperimentRecord(
            name=self.space.name, space=spec.model_dump(mode="json"), objectives=objectives, engine=engine,
            trials=trials, seed=spec.search.seed, seeds=seeds, created=time.time(), seq_len=spec.seq_len,
            storage=url and study_storage(self.out, url), identity=identity(self.space)))

    def resumed_folders(self, records: dict[str, TrialRecord]) -> None:
        """The run folders a resume continues in (those of trials left running, their
        replicates not yet complete) are not symlinks: refused in one line before the study
        is touched (:func:`runners.checkpoint.run_folder`; issue #34)."""
        for r in records.values():
            if r.status != Status.RUNNING or r.duplicate_of:
                continue
            for rep in r.replicates or [None]:
                if rep is None or rep.status != Status.COMPLETE:
                    run_folder(self.out / TRIALS, run_dir(self.out, r, rep and rep.index), resume=True)

    def abandon(self) -> None:
        """A start that failed: release the directory; a new experiment leaves nothing behind
        (so a rerun is not refused as 'already holds an experiment'): only the files this
        start created, and the directories it created once they are empty."""
        if self.lock is None:
            return
        if self.wrote:
            for name in self.fresh:
                if name != TRIALS and (self.out / name).is_file():
                    (self.out / name).unlink()
            for folder in ([self.out / TRIALS] if TRIALS in self.fresh else []) + self.lock.made:
                if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                    folder.rmdir()
        self.release()

    def retake(self) -> bool:
        """The lock again, where the engine released it; False: another holds it now."""
        from nas.errors import LoopnasError

        if self.lock.held:
            return True
        made = self.lock.made
        try:
            self.lock = acquire(self.out)
        except LoopnasError:
            return False
        self.lock.made = made
        return True

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


__all__ = ["APPENDED", "OWN", "Recorder", "ExperimentDir", "reusable", "mean_points", "mean_rungs",
           "replicate_fields", "concluded", "as_duplicate"]
