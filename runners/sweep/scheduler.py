"""Replicate jobs from a candidate's admission to its end: one job per seed, queued for a
worker, given out, returned; a candidate ended early (a replicate failed, or it was
stopped) has its queued jobs dropped; a replicate that ran out of memory beside others is
queued first again, alone on a device (``search.on_oom: retry_alone``).

It keeps which candidates are in flight and writes nothing: the driver records what it
decides (:class:`.driver.Sweep`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from nas.space import Space
from runners.checkpoint import LinkError, run_folder
from runners.results.records import TRIALS, Replicate, TrialRecord, run_dir
from runners.results.status import Status

from .devices import job_placement
from .job import Job, ServingJob
from .study import SweepError


class Scheduler:
    def __init__(self, space: Space, out: Path, seeds: int):
        self.space, self.out, self.seeds = space, out, seeds
        spec = space.spec
        self.quality = next((o for o in spec.objectives if o.quality), None)
        self.serving = [o for o in spec.objectives if o.serving]
        self.trials: dict[str, Any] = {}  # id → the live optuna trial of a candidate not yet settled
        self.active: set[str] = set()  # candidates with replicates still to finish
        self.queue: list[Job] = []  # replicate jobs of admitted candidates, waiting for a worker
        self.running: dict[str, Job] = {}  # job id → a replicate given to a worker
        self.ended: dict[str, dict] = {}  # candidate → how it ended, while its replicates wind down
        self.waiting: dict[str, list[str]] = {}  # spec hash → duplicate ids awaiting the original

    def in_flight(self) -> int:
        """Candidates asked and not yet settled: training, or duplicates awaiting one."""
        return len(self.active) + sum(map(len, self.waiting.values()))

    def replicates(self, previous: TrialRecord | None) -> list[Replicate]:
        """Fresh replicates; on a resume, those already complete are kept and the others keep
        their rungs (the re-run continues from its checkpoint and reports the rest)."""
        base = self.space.spec.search.seed
        old = {r.index: r for r in previous.replicates} if previous is not None else {}
        out = []
        for i in range(self.seeds):
            r = old.get(i)
            if r is not None and r.status == Status.COMPLETE:
                out.append(r)
            else:
                out.append(Replicate(index=i, seed=base + i, rungs=r.rungs if r is not None else []))
        return out

    def admit(self, trial, record: TrialRecord, config: dict, resume: bool) -> list[Job]:
        """The candidate of ``record`` (its replicates set) is in flight; its jobs, one per
        replicate not yet complete (none: every one finished before an interruption)."""
        self.trials[record.id] = trial
        self.active.add(record.id)
        return [self._job(record, rep, config, resume) for rep in record.replicates if rep.status != Status.COMPLETE]

    def _job(self, record: TrialRecord, rep: Replicate, config: dict, resume: bool) -> Job:
        one = self.seeds == 1  # one seed: the layout of experiments written before replicates
        job_dir = run_dir(self.out, record, rep.index)  # the layout export reads back
        try:  # never a symlink: replaced where the run starts afresh, refused where it resumes
            run_folder(self.out / TRIALS, job_dir, resume=resume)
        except LinkError as exc:
            raise SweepError(str(exc)) from None
        search, seq_len = self.space.spec.search, self.space.spec.seq_len
        return Job(id=record.id if one else f"{record.id}-s{rep.index}", trial=record.id, replicate=rep.index,
                   arch=record.arch, config={**config, "seed": rep.seed}, dir=str(job_dir),
                   metric=self.quality.metric if self.quality else "eval_loss",
                   serving=tuple(ServingJob(name=o.name, metric=o.metric, seq_len=o.seq_len or seq_len,
                                            batch_size=o.batch_size or 1) for o in self.serving),
                   timeout=search.trial_timeout, resume=resume, **job_placement(search.resources))

    def await_original(self, spec_hash: str, trial, rid: str) -> None:
        """A duplicate of a candidate still training: settled when that one is."""
        self.waiting.setdefault(spec_hash, []).append(rid)
        self.trials[rid] = trial

    def take(self) -> Job | None:
        """The next queued job, now given out."""
        if not self.queue:
            return None
        job = self.queue.pop(0)
        self.running[job.id] = job
        return job

    def end(self, rid: str, how: dict) -> None:
        """Candidate ``rid`` ends as ``how`` says (its first end wins) once its replicates have
        wound down; those not yet started never will."""
        self.ended.setdefault(rid, how)
        self.queue = [j for j in self.queue if j.trial != rid]

    def retry_alone(self, job: Job, share: float | None) -> bool:
        """``search.on_oom: retry_alone``: a replicate that ran out of memory beside others
        on a shared device is queued first, to rerun from its checkpoint with a whole device
        to itself (the engine places ``alone`` jobs so). False: its OOM is final."""
        if (job.alone or share is None or share >= 1 or job.trial in self.ended
                or self.space.spec.search.on_oom != "retry_alone"):
            return False
        placement = job_placement(self.space.spec.search.resources, alone=True)
        self.queue.insert(0, job.model_copy(update={"alone": True, "resume": True, **placement}))
        return True

    def idle(self, rid: str) -> bool:
        """No replicate of ``rid`` runs or waits."""
        return not any(j.trial == rid for j in self.running.values()) and not any(j.trial == rid for j in self.queue)

    def settle(self, rid: str) -> tuple[Any, dict | None]:
        """``rid`` is no longer in flight: its trial, and how it ended (None: complete)."""
        self.active.discard(rid)
        return self.trials.pop(rid), self.ended.pop(rid, None)

    def clear(self) -> None:
        """Stopping early: nothing is in flight any more (left to --resume)."""
        for part in (self.active, self.waiting, self.running, self.ended):
            part.clear()
        self.queue.clear()


__all__ = ["Scheduler"]
