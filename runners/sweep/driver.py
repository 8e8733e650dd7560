"""The sweep driver shared by both backends: the Optuna study, the gate that prices and
deduplicates every candidate before it may train, the records, resumption.

Whichever backend runs the trials, the driver alone asks and tells the study and writes
the experiment directory, so both backends produce the same results. A candidate is
gated in the driver: an invalid spec or a violated constraint is recorded as
``infeasible`` and never reaches a worker; a canonical spec already trained (same hash)
is recorded as ``duplicate`` and reuses the first result.
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from nas.errors import LoopnasError, SpecError
from nas.graph import summary
from nas.noise import mean_se
from nas.space import Space, changes, cost_value, grid_size, identity, spec_hash, violations
from runners.checkpoint import LinkError, atomic, run_folder
from runners.results.front import front
from runners.results.records import (
    EXPERIMENT, INDEX, INDEX_MORE, JOURNAL, TRIALS, ExperimentRecord, Objective, Point, Replicate, RecordError,
    Rung, TrialRecord, read_experiment, read_trials, repair_journal, run_dir, study_storage, trial_path, write_json,
)
from runners.results.status import FINAL, SHOWN, optuna_state
from runners.track import Tracking, annotate, mark_front, wanted

from .devices import job_placement
from .job import Job, ServingJob
from .lock import LOCK, LockError, acquire
from .stopping import ParetoHalving

# entries of an experiment directory that are appended to or written inside (not replaced
# whole by the atomic write): never through a symlink (Sweep._links). The journal, the trial
# records and runs, the artifact store (runners.track.study.ARTIFACTS), TensorBoard's and
# MLflow's files, Ray's, a one-shot sweep's supernet and its self-check (runners.oneshot.check.CHECK).
APPENDED = (JOURNAL, TRIALS, "artifacts", "tensorboard", "mlartifacts", "ray", "supernet", "check")
# and those written whole, atomically (a link there is replaced anyway): a new experiment
# replaces a link at any of them before it starts
OWN = (*APPENDED, EXPERIMENT, "space.yaml", "space.py", INDEX, INDEX_MORE, "oneshot.json", "tracking.json")
_ID, _RESUME = "loopnas_id", "loopnas_resume"


class SweepError(LoopnasError):
    """A sweep cannot start (a usage problem): one line, exit code 2."""


def make_sampler(space: Space, trials: int):
    """An Optuna sampler by name, sized for small sweeps (TPE's 10 start-up trials and
    NSGA-II's population of 50 would make a small sweep pure random search)."""
    import optuna

    search = space.spec.search
    name, params = search.sampler.lower(), dict(search.sampler_params)
    seed = params.pop("seed", search.seed)
    if name == "tpe":
        params.setdefault("n_startup_trials", max(2, min(10, trials // 4)))
        return optuna.samplers.TPESampler(seed=seed, **params)
    if name == "nsga2":
        params.setdefault("population_size", max(4, min(50, trials // 3)))
        return optuna.samplers.NSGAIISampler(seed=seed, **params)
    if name == "grid":
        grid = params.pop("search_space", None) or _grid(space)
        return _grid_sampler()(grid, seed=seed, **params)
    classes = {"random": "RandomSampler", "qmc": "QMCSampler", "gp": "GPSampler",
               "cmaes": "CmaEsSampler", "bruteforce": "BruteForceSampler"}
    cls = getattr(optuna.samplers, classes.get(name, search.sampler), None)
    if cls is None:
        raise SweepError(f"search.sampler: optuna has no sampler {search.sampler!r}")
    return cls(seed=seed, **params)


def _grid(space: Space) -> dict[str, list]:
    from nas.space import MAX_GRID, _label, grid_points

    if space.sample_fn is not None:
        raise SweepError("search.sampler: grid over a Python space needs sampler_params.search_space")
    size = grid_points(space.spec)  # counted before anything is listed
    if size is not None and size > MAX_GRID:
        raise SweepError(f"search.sampler: a grid of more than {MAX_GRID:,} points cannot be listed")
    grid = {}
    for name, p in space.spec.params.items():
        if p.kind == "categorical":
            grid[name] = [_label(c) for c in p.choices]
        elif p.kind == "int":
            grid[name] = list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
        elif p.step is not None:
            n = int((p.high - p.low) / p.step + 1e-9) + 1
            grid[name] = [p.low + i * p.step for i in range(n)]
        else:
            raise SweepError(f"params.{name}: a grid needs finite choices (give step for a float range)")
    return grid


def _grid_sampler():
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        """Optuna's grid, without its ``study.stop()`` once the grid is exhausted: that
        works only inside ``study.optimize``, and the driver's budget ends the sweep."""

        def after_trial(self, study, trial, state, values) -> None:
            pass

    return GridSampler


def _merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _constrain(trial, violated) -> None:
    """Each (constraint, violation > 0 if violated) on the trial itself, where Optuna's
    constraint-aware samplers (TPE, NSGA-II, GP, ...) and ``best_trials`` read it
    (``Trial.set_constraint``; the samplers' ``constraints_func`` is deprecated)."""
    for i, (c, v) in enumerate(violated):
        trial.set_constraint(f"{i}: {c.text}", max(0.0, v))


def check_proxy(space: Space) -> None:
    """The space's proxy as the trainer will read it: a bad field or task parameter is one
    clear error before any trial starts, not the same failure in every trial."""
    from pydantic import ValidationError

    from runners.tasks import make_task
    from runners.train import TrainConfig

    proxy = proxy_config(space)
    try:
        config = TrainConfig.model_validate({**proxy, "seed": space.spec.search.seed})
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(map(str, e["loc"]))
        raise SweepError(f"{space.source}: proxy{'.' + where if where else ''}: {e['msg']}") from None
    try:
        if config.curriculum is None:
            make_task(config.task, **config.task_params)
    except (TypeError, ValueError) as exc:
        raise SweepError(f"{space.source}: proxy.task {config.task!r}: {exc}") from None


def check_start(space: Space, backend: str) -> None:
    """What would fail every trial, refused before anything is written: a local sweep's CPUs
    per trial beyond the machine's (:func:`nas.space.local_problem`), and a Python space
    whose ``sample()`` raises on its first call (on a throwaway in-memory trial)."""
    import optuna

    from nas.space import local_problem

    problem = local_problem(space.spec) if backend == "optuna" else None
    if problem is not None:
        raise SweepError(f"{space.source}: {problem}")
    if backend == "optuna" and space.spec.search.resources.gpu > 0:
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


def _reusable(record: TrialRecord) -> bool:
    """Whether a finished trial's outcome is the candidate's own (deterministic), so an
    identical candidate would repeat it: not a timeout, not a crash of its process."""
    return record.status in ("complete", "pruned") or record.status == "failed" and not record.crashed


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


class Sweep:
    """One experiment directory and its study; see the module docstring.

    With ``seeds`` > 1 every candidate (one Optuna trial, one record) is trained as that
    many replicate jobs (seeds ``search.seed + i``, the same eval batches); the trial is
    settled when all of them are, and the study is told their mean."""

    def __init__(self, space: Space, out: str | Path, backend: str, trials: int | None = None,
                 resume: bool = False, seeds: int | None = None, planned: list[dict] | None = None,
                 track: list[str] | None = None):
        self.lock, self._wrote, self.tracking = None, False, Tracking()
        try:
            self._setup(space, out, backend, trials, resume, seeds, planned)
        except BaseException as exc:
            self._abandon()
            if isinstance(exc, (LockError, RecordError, LinkError)):
                raise SweepError(str(exc)) from None
            raise
        # search.track and --track: logged here, by the one writer (runners.track)
        self.tracking = Tracking(self.out, wanted(space.spec.search.track, track))
        self.tracking.on_start(read_experiment(self.out), resume)

    def _setup(self, space: Space, out: str | Path, backend: str, trials: int | None, resume: bool,
               seeds: int | None, planned: list[dict] | None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        check_proxy(space)
        check_start(space, backend)
        self.space, self.out, self.backend = space, Path(out), backend
        spec = space.spec
        self.objectives = [Objective(name=o.name, direction=o.direction, measured=o.measured,
                                     serving=o.serving) for o in spec.objectives]
        self.quality = next((o for o in spec.objectives if o.quality), None)
        self.serving = [o for o in spec.objectives if o.serving]
        self.total = trials or spec.search.trials
        self.seeds = seeds or space_seeds(space)
        self.final = FINAL
        if spec.search.sampler.lower() == "grid" and space.sample_fn is None:
            self.total = min(self.total, grid_size(space) or self.total)
            self.final = (*FINAL, "infeasible")
        if planned is not None:  # a fixed design (calibration): its points are the budget
            self.total, self.final = len(planned), (*FINAL, "infeasible")
        self._open(resume)
        # read before the study is touched: a damaged record refuses a resume with nothing written
        self.records: dict[str, TrialRecord] = {r.id: r for r in read_trials(self.out)}
        if resume:
            self._resumed_folders()
        self.storage = self._storage(spec.search.storage)
        self.sampler = make_sampler(space, self.total)
        self.study = optuna.create_study(
            storage=self.storage, sampler=self.sampler, study_name=spec.name, load_if_exists=True,
            directions=[o.direction for o in spec.objectives])
        with warnings.catch_warnings():  # experimental since Optuna 3.2, still in 5.0
            warnings.simplefilter("ignore")
            self.study.set_metric_names([o.name for o in self.objectives])
        if planned is not None and not resume:
            for params in planned:
                self.study.enqueue_trial(params, skip_if_exists=False)
        self.by_hash = {r.spec_hash: r.id for r in self.records.values() if _reusable(r) and r.spec_hash}
        self.trials: dict[str, Any] = {}  # id → the live optuna trial of an active candidate
        self.active: set[str] = set()  # candidates with replicates still to finish
        self.queue: list[Job] = []  # replicate jobs of gated candidates, waiting for a worker
        self.jobs: dict[str, tuple[str, int]] = {}  # job id of a running replicate → (trial, index)
        self.given: dict[str, Job] = {}  # job id → the job, to rerun it alone after an OOM
        self.doomed: dict[str, dict] = {}  # trial → how it ended, while its replicates wind down
        self.waiting: dict[str, list[str]] = {}  # hash → duplicate ids awaiting the original
        self.infeasible_streak = 0
        es = spec.search.early_stopping
        self.stopper = None
        if es:
            margin = es.margin if es.margin is not None else ("auto" if self.seeds > 1 else 0.0)
            self.stopper = ParetoHalving(es.rungs, margin, es.min_beaten_by)
        self._sheets: dict[str, dict] = {}
        if self.stopper is not None:
            for r in self.records.values():
                for i, rep in enumerate(r.replicates or [Replicate(index=0, seed=r.seed, rungs=r.rungs)]):
                    for rung in rep.rungs:
                        if r.arch is not None and rung.quality is not None and rung.step in es.rungs:
                            self.stopper.record(r.id, rung.step, self._cost_key(r),
                                                self._oriented(rung.quality), replicate=i)
        if resume:
            self._recover()

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

    def _open(self, resume: bool) -> None:
        had_lock = os.path.lexists(self.out / LOCK)
        self.lock = acquire(self.out)  # before anything is read or written: one driver at a time
        self._links((self.out / EXPERIMENT).is_file())
        # what this start creates, and so what a start that fails removes again (nothing else)
        self._fresh = [name for name in (EXPERIMENT, f"space{self.space.source.suffix}", JOURNAL, TRIALS)
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
            if old.seeds != self.seeds:
                raise SweepError(f"--seeds: {self.out} was started with {old.seeds} seed(s) per candidate; "
                                 f"resume it with --seeds {old.seeds}")
            return
        self._wrote, url = True, self.space.spec.search.storage
        (self.out / TRIALS).mkdir(parents=True, exist_ok=True)
        with atomic(self.out / f"space{self.space.source.suffix}") as tmp:  # never through a link
            shutil.copyfile(self.space.source, tmp)
        write_json(self.out / EXPERIMENT, ExperimentRecord(
            name=self.space.name, space=self.space.spec.model_dump(mode="json"),
            objectives=self.objectives, backend=self.backend, trials=self.total,
            seed=self.space.spec.search.seed, seeds=self.seeds, created=time.time(),
            seq_len=self.space.spec.seq_len, storage=url and study_storage(self.out, url),
            identity=identity(self.space)))

    def _resumed_folders(self) -> None:
        """The run folders a resume continues in (those of trials left running, their
        replicates not yet complete) are not symlinks: refused in one line before the study
        is touched (:func:`runners.checkpoint.run_folder`; issue #34)."""
        for r in self.records.values():
            if r.status != "running" or r.duplicate_of:
                continue
            for rep in r.replicates or [None]:
                if rep is None or rep.status != "complete":
                    run_folder(self.out / TRIALS, run_dir(self.out, r, rep and rep.index), resume=True)

    def _storage(self, url: str | None):
        """The study's storage: the RDB at ``url``, else the journal in the directory (a
        torn last entry cut off first: :func:`repair_journal`). ``self.where`` says which."""
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        self.where = study_storage(self.out, url)
        if url:
            try:
                return optuna.storages.RDBStorage(url)
            except Exception as exc:  # a bad URL, a missing driver, a database it cannot open
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise SweepError(f"{self.space.source}: search.storage {self.where}: cannot open the study "
                                 f"({why}); fix the URL or remove storage to keep the study in --out") from None
        cut = repair_journal(self.out / JOURNAL)
        self.where += f" (a torn last entry of {cut} bytes cut off)" if cut else ""
        return JournalStorage(JournalFileBackend(str(self.out / JOURNAL)))

    def _abandon(self) -> None:
        """A start that failed: release the directory; a new experiment leaves nothing behind
        (so a rerun is not refused as 'already holds an experiment'): only the files this
        start created, and the directories it created once they are empty."""
        if self.lock is None:
            return
        if self._wrote:
            for name in self._fresh:
                if name != TRIALS and (self.out / name).is_file():
                    (self.out / name).unlink()
            for folder in ([self.out / TRIALS] if TRIALS in self._fresh else []) + self.lock.made:
                if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                    folder.rmdir()
        self.close()

    def abandon_unstarted(self) -> bool:
        """The sweep failed before its first trial (a pool or a Ray cluster that cannot start):
        a new experiment is removed as if never started (:meth:`_abandon`); True if so."""
        if not self._wrote or self.records or any((self.out / TRIALS).glob("t*.json")):
            return False
        if not self.lock.held:  # released by the backend: take it again, or leave it to its holder
            made = self.lock.made
            try:
                self.lock = acquire(self.out)
            except LoopnasError:
                return False
            self.lock.made = made
        self._abandon()
        return True

    def close(self) -> None:
        """The sweep has ended (finished, failed or interrupted): another driver may resume it."""
        self.tracking.close()
        if self.lock is not None:
            self.lock.release()

    def _write(self, record: TrialRecord) -> None:
        self.records[record.id] = record
        write_json(trial_path(self.out, record.id), record)

    def _recover(self) -> None:
        """After a crash: trials left running are failed in the study and queued again with
        the same parameters; the re-run keeps its id and resumes from its checkpoint."""
        import optuna

        states = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        running = {r.number for r in self.records.values() if r.status == "running"}
        recorded = {r.number for r in self.records.values()}
        # asked but never recorded (its first record write hit a full disk, or a kill came
        # first): asked again with its parameters, so a grid point is not lost. Only with the
        # journal: on a shared RDB, trials without a record here are other drivers'.
        lost = [] if self.space.spec.search.storage else [
            t for t in states.values() if t.state == optuna.trial.TrialState.RUNNING and t.number not in recorded]
        for number, t in states.items():
            if t.state == optuna.trial.TrialState.RUNNING:
                self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        queued = {t.user_attrs.get(_ID) for t in states.values() if t.state == optuna.trial.TrialState.WAITING}
        for r in self.records.values():
            if r.number in running and r.number in states and r.id not in queued:
                self.study.enqueue_trial(states[r.number].params, user_attrs={_ID: r.id, _RESUME: True},
                                         skip_if_exists=False)
        for t in lost:
            rid, params = t.user_attrs.get(_ID) or f"t{t.number:04d}", self._placed(t)
            if rid not in queued and params:  # none: the trial never held a point, so none is lost
                self.study.enqueue_trial(params, user_attrs={_ID: rid}, skip_if_exists=False)

    def _placed(self, trial) -> dict:
        """The parameters a lost trial was given. On a grid, the whole point its ``grid_id``
        names (the journal may have been cut before every parameter was written): Optuna's
        grid refuses an enqueued trial that fixes only some, and a failed trial's point
        counts as visited, so it must be asked again whole or it is lost."""
        import optuna

        grid_id = trial.system_attrs.get("grid_id")
        if isinstance(self.sampler, optuna.samplers.GridSampler) and isinstance(grid_id, int):
            return dict(zip(self.sampler._param_names, self.sampler._all_grids[grid_id]))
        return dict(trial.params)

    def counted(self) -> int:
        """Trials that use the budget: finished ones and those running in this driver.
        Infeasible candidates cost nothing and do not count, except on a grid, whose budget
        is its points. On a shared RDB (``search.storage``) the study's trials are counted,
        whichever driver runs them: ``trials: N`` is N for the whole study."""
        if self.space.spec.search.storage:
            return self._study_counted(None)
        final = sum(r.status in self.final for r in self.records.values())
        return final + len(self.active) + sum(map(len, self.waiting.values()))

    def _study_counted(self, below: int | None) -> int:
        """The study's trials that use the budget (numbered below ``below``): those in
        flight in any driver, and those settled with a status that counts."""
        import optuna

        TS, n = optuna.trial.TrialState, 0
        for t in self.study.get_trials(deepcopy=False):
            if below is not None and t.number >= below:
                continue
            settled = t.user_attrs.get("loopnas", {}).get("status")
            n += t.state == TS.RUNNING if settled is None else settled in self.final
        return n

    def _beyond_budget(self, trial) -> bool:
        """On a shared RDB, drivers that ask at the same moment could overshoot the budget:
        trials are ranked by number, and one that finds the budget spent by the trials
        numbered before it is withdrawn (told FAIL, never trained)."""
        if not self.space.spec.search.storage or self._study_counted(trial.number) < self.total:
            return False
        import optuna

        trial.set_user_attr("loopnas", {"id": None, "status": "withdrawn", "duplicate_of": None})
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return True

    def wants_more(self) -> bool:
        return self.counted() < self.total and self.infeasible_streak < 50 * self.total

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(SHOWN, 0)
        for r in self.records.values():
            if r.status == "running" and r.id not in self.active and not r.duplicate_of:
                continue  # interrupted, queued again
            out[r.status] += 1
        return out

    def next_job(self) -> Job | None:
        """The next replicate job to run: a queued one, else ask the study until a candidate
        must be trained (both backends take their jobs here). None: the budget is spent and
        nothing is queued."""
        while not self.queue and self.wants_more():
            trial = self.study.ask()
            if not self._beyond_budget(trial):
                self.queue.extend(self.gate(trial))
        if not self.queue:
            return None
        job = self.queue.pop(0)
        self.jobs[job.id] = (job.trial, job.replicate)
        self.given[job.id] = job
        self._update_replicate(job.trial, job.replicate, status="running", started=time.time())
        return job

    def _update_replicate(self, rid: str, index: int, **fields) -> TrialRecord:
        record = self.records[rid]
        reps = list(record.replicates)
        reps[index] = reps[index].model_copy(update=fields)
        record = record.model_copy(update={"replicates": reps, "rungs": mean_rungs(reps)})
        self._write(record)
        return record

    def gate(self, trial) -> list[Job]:
        """Price and check a sampled trial. Returns its replicate jobs to train (those not
        already complete, on a resume), or none when the trial was settled here
        (infeasible, or a duplicate)."""
        rid = trial.user_attrs.get(_ID) or f"t{trial.number:04d}"
        record = TrialRecord(id=rid, number=trial.number, status="running", seed=self.space.spec.search.seed,
                             started=time.time())
        try:
            arch, proxy, params = self.space.candidate(trial)
        except SpecError as exc:
            _constrain(trial, [(c, 1.0) for c in self.space.constraints])
            self.infeasible_streak += 1
            record = record.model_copy(update={"params": dict(trial.params), "status": "infeasible",
                                               "reason": "invalid spec: " + "; ".join(p.render(None) for p in exc.problems)})
            self._settle(trial, record, None)
            return []
        h = spec_hash(arch, proxy)
        sheets: dict = {}
        bad = violations(self.space, arch, sheets)
        record = record.model_copy(update={
            "params": params, "spec_hash": h, "arch": arch.model_dump(mode="json"), "summary": summary(arch),
            "cost": self._sheet(arch, sheets),
            "violations": [f"{c.text} (is {cost_value(arch, c.metric, c.seq_len or self.space.spec.seq_len, sheets=sheets):.4g})"
                           for c, v in bad if v > 0]})
        self._sheets[rid] = sheets
        _constrain(trial, bad)
        if record.violations:
            self.infeasible_streak += 1
            self._settle(trial, record.model_copy(update={"status": "infeasible",
                                                          "reason": "; ".join(record.violations)}), None)
            return []
        self.infeasible_streak = 0
        if h in self.by_hash:
            original = self.records[self.by_hash[h]]
            self._settle(trial, self._as_duplicate(record, original), original)
            return []
        if any(self.records[i].spec_hash == h for i in self.active):
            original = next(i for i in self.active if self.records[i].spec_hash == h)
            self.waiting.setdefault(h, []).append(rid)
            self.trials[rid] = trial
            self._write(record.model_copy(update={"duplicate_of": original}))
            return []
        resume = bool(trial.user_attrs.get(_RESUME))
        replicates = self._replicates(self.records.get(rid) if resume else None)
        self.trials[rid] = trial
        self.active.add(rid)
        self._write(record.model_copy(update={"replicates": replicates, "rungs": mean_rungs(replicates)}))
        config = _merge(proxy_config(self.space), proxy)
        config.update(eval_seed=self.space.spec.search.seed, checkpoint_every=self.space.spec.proxy.eval_every)
        jobs = [self._job(rid, rep, config, resume) for rep in replicates if rep.status != "complete"]
        if not jobs:  # every replicate finished before the interruption
            self._conclude(rid)
        return jobs

    def _replicates(self, previous: TrialRecord | None) -> list[Replicate]:
        """Fresh replicates; on a resume, those already complete are kept and the others keep
        their rungs (the re-run continues from its checkpoint and reports the rest)."""
        base = self.space.spec.search.seed
        old = {r.index: r for r in previous.replicates} if previous is not None else {}
        out = []
        for i in range(self.seeds):
            r = old.get(i)
            if r is not None and r.status == "complete":
                out.append(r)
            else:
                out.append(Replicate(index=i, seed=base + i, rungs=r.rungs if r is not None else []))
        return out

    def _job(self, rid: str, rep: Replicate, config: dict, resume: bool) -> Job:
        record = self.records[rid]
        one = self.seeds == 1  # one seed: the layout of experiments written before replicates
        job_dir = run_dir(self.out, record, rep.index)  # the layout export reads back
        try:  # never a symlink: replaced where the run starts afresh, refused where it resumes
            run_folder(self.out / TRIALS, job_dir, resume=resume)
        except LinkError as exc:
            raise SweepError(str(exc)) from None
        return Job(id=rid if one else f"{rid}-s{rep.index}", trial=rid, replicate=rep.index,
                   arch=record.arch, config={**config, "seed": rep.seed}, dir=str(job_dir),
                   metric=self.quality.metric if self.quality else "eval_loss",
                   serving=tuple(ServingJob(name=o.name, metric=o.metric, seq_len=o.seq_len or self.space.spec.seq_len,
                                            batch_size=o.batch_size or 1) for o in self.serving),
                   timeout=self.space.spec.search.trial_timeout, resume=resume,
                   **job_placement(self.space.spec.search.resources))

    def _sheet(self, arch, sheets: dict) -> dict:
        cost_value(arch, "unique_params", self.space.spec.seq_len, sheets=sheets)
        return sheets[self.space.spec.seq_len].to_dict()

    def _as_duplicate(self, record: TrialRecord, original: TrialRecord) -> TrialRecord:
        return record.model_copy(update={
            "status": "duplicate", "duplicate_of": original.id, "points": original.points,
            "reason": f"same canonical spec as {original.id} ({original.status}); its result is reused",
            "finished": time.time()})

    def _cost_key(self, record: TrialRecord) -> tuple[float, ...]:
        """The cost objectives of a trial, oriented lower-is-better."""
        out = []
        for o in self.space.spec.objectives:
            if not o.measured:
                value = cost_value(self._arch(record), o.metric, o.seq_len or self.space.spec.seq_len,
                                   sheets=self._sheets.setdefault(record.id, {}))
                out.append(value if o.direction == "minimize" else -value)
        return tuple(out)

    def _arch(self, record: TrialRecord):
        from nas.spec import ArchSpec

        return ArchSpec.model_validate(record.arch)

    def _oriented(self, quality: float) -> float:
        return quality if self.quality is None or self.quality.direction == "maximize" else -quality

    def on_rung(self, job_id: str, rung: Rung) -> bool:
        """Record a replicate's rung; False: stop it here (Pareto-aware early stopping, or its
        candidate already ended through another replicate)."""
        if job_id not in self.jobs:
            return False  # a late result of a trial already settled
        rid, index = self.jobs[job_id]
        if rid in self.doomed:
            return False
        # a run resumed from a checkpoint reports its steps again from there
        kept = [r for r in self.records[rid].replicates[index].rungs if r.step < rung.step]
        record = self._update_replicate(rid, index, rungs=[*kept, rung])
        if self.stopper is None or record.arch is None or record.arch.get("elastic"):
            return True  # an elastic trial yields a whole curve: it is never stopped
        quality = None if rung.quality is None else self._oriented(rung.quality)
        if self.stopper.decide(rid, rung.step, self._cost_key(record), quality, replicate=index):
            self.doomed[rid] = {"status": "pruned", "reason": f"stopped early at step {rung.step}"}
            self.queue = [j for j in self.queue if j.trial != rid]
            return False
        return True

    def points(self, record: TrialRecord, measured: list[dict]) -> list[Point]:
        """One point per evaluated loop count (elastic), else one: every objective's value
        (quality from the proxy, serving metrics as the trial measured them at that loop
        count, cost-model values priced at it)."""
        elastic = [m for m in measured if m["k"] is not None]
        out = []
        for m in elastic or measured:
            values = {}
            for o in self.space.spec.objectives:
                if o.quality:
                    values[o.name] = float(m["value"])
                elif o.serving:
                    values[o.name] = float(m["serving"][o.name])
                else:
                    values[o.name] = cost_value(self._arch(record), o.metric, o.seq_len or self.space.spec.seq_len,
                                                k=m["k"], sheets=self._sheets.setdefault(record.id, {}))
            out.append(Point(k=m["k"], values=values))
        return out

    def finish(self, job_id: str, outcome: dict[str, Any]) -> None:
        """Record a replicate's outcome; once every replicate of its candidate has ended,
        settle the candidate (tell the study the mean, settle its duplicates). A replicate
        that fails, times out or is stopped ends its candidate the same way."""
        if job_id not in self.jobs:
            return
        rid, index = self.jobs.pop(job_id)
        job = self.given.pop(job_id, None)
        record = self.records[rid]
        status = outcome["status"]
        rep = record.replicates[index]
        if status == "oom" and rid not in self.doomed and self._retry_alone(job, rep, outcome):
            return
        rungs = rep.rungs or [Rung.model_validate(r) for r in outcome.get("rungs") or []]
        record = self._update_replicate(
            rid, index, status=status, reason=outcome.get("reason"), rungs=rungs,
            points=self.points(record, outcome["measured"]) if status == "complete" else [],
            crashed=bool(outcome.get("crashed")), node=outcome.get("node"),
            devices=outcome.get("devices") or rep.devices, ran_on=outcome.get("ran_on"),
            peak_memory=outcome.get("peak_memory"),
            started=outcome.get("started", rep.started), finished=outcome.get("finished", time.time()),
            wall_time=outcome.get("wall_time"))
        self.tracking.on_replicate(record, index)
        if status != "complete" and rid not in self.doomed:
            who = f"replicate {index} (seed {rep.seed}): " if self.seeds > 1 else ""
            self.doomed[rid] = {"status": status, "reason": who + (outcome.get("reason") or status),
                                "crashed": bool(outcome.get("crashed"))}
            self.queue = [j for j in self.queue if j.trial != rid]
        if not any(t == rid for t, _ in self.jobs.values()) and not any(j.trial == rid for j in self.queue):
            self._conclude(rid)

    def _retry_alone(self, job: Job | None, rep: Replicate, outcome: dict) -> bool:
        """``search.on_oom: retry_alone``: a replicate that ran out of memory beside others
        on a shared device is queued first, to rerun from its checkpoint with a whole device
        to itself (the backend places ``alone`` jobs so). False: its OOM is final."""
        share = outcome.get("share")
        if (job is None or job.alone or share is None or share >= 1
                or self.space.spec.search.on_oom != "retry_alone"):
            return False
        self._update_replicate(job.trial, job.replicate, status="queued", retried=outcome.get("reason"),
                               devices=outcome.get("devices") or rep.devices, peak_memory=outcome.get("peak_memory"))
        placement = job_placement(self.space.spec.search.resources, alone=True)
        self.queue.insert(0, job.model_copy(update={"alone": True, "resume": True, **placement}))
        return True

    def _conclude(self, rid: str) -> None:
        """Every replicate of ``rid`` has ended: write and tell the candidate's outcome."""
        self.active.discard(rid)
        record = self.records[rid]
        reps = record.replicates
        ended = self.doomed.pop(rid, None)
        if ended is None:
            update = {"status": "complete", "reason": None, "points": mean_points(reps)}
        else:
            update = {**ended, "points": []}
        walls = [r.wall_time for r in reps if r.wall_time is not None]
        record = record.model_copy(update={
            **update, "rungs": mean_rungs(reps), "node": next((r.node for r in reps if r.node), None),
            "devices": sorted({d for r in reps for d in r.devices}),
            "peak_memory": max((r.peak_memory for r in reps if r.peak_memory is not None), default=None),
            "started": min((r.started for r in reps if r.started), default=record.started),
            "finished": max((r.finished for r in reps if r.finished), default=time.time()),
            "wall_time": sum(walls) if walls else None})
        self._settle(self.trials.pop(rid), record, None)
        if _reusable(record):
            self.by_hash[record.spec_hash] = rid  # deterministic outcomes: a duplicate would repeat them
        for dup in self.waiting.pop(record.spec_hash, []):
            self._settle(self.trials.pop(dup), self._as_duplicate(self.records[dup], record), record)

    def _settle(self, trial, record: TrialRecord, original: TrialRecord | None) -> None:
        """Write the record and tell the study what became of the trial."""
        self._write(record)
        trial.set_user_attr("loopnas", {"id": record.id, "status": record.status,
                                        "duplicate_of": record.duplicate_of})
        annotate(trial, record, self.out)  # what the Optuna dashboard shows of it
        status = original.status if original is not None else record.status
        main = record.points[-1].values if record.points else None
        if status == "complete" and main is not None:
            self.study.tell(trial, [main[o.name] for o in self.objectives])
        elif status == "infeasible" and self.space.constraints and record.arch is not None and (
                self.quality or self.serving):
            # constraint-aware samplers learn the infeasible region from complete trials
            # whose constraints are > 0; plain Optuna's best_trials leaves them out.
            values = {o.name: _fill(o) if o.measured else cost_value(self._arch(record), o.metric,
                      o.seq_len or self.space.spec.seq_len, sheets=self._sheets.get(record.id, {}))
                      for o in self.space.spec.objectives}
            self.study.tell(trial, [values[o.name] for o in self.objectives])
        else:  # a complete trial with no finite point is told as failed
            self.study.tell(trial, state=optuna_state("failed" if status == "complete" else status))
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
        self.active.clear()
        self.waiting.clear()
        self.queue.clear()
        self.jobs.clear()
        self.given.clear()
        self.doomed.clear()


def _fill(objective) -> float:
    """A poor value for a measured objective of a trial that never ran (serving bytes and
    milliseconds can exceed the 1e9 that is poor for a loss)."""
    if objective.direction == "maximize":
        return 0.0
    return 1e18 if objective.serving else 1e9


def default_out(space: Space) -> Path:
    """``runs/<space name>``, never outside ``runs/`` (:func:`nas.spec.named_path`)."""
    from nas.spec import named_path

    return named_path("runs", space.name)


__all__ = ["Sweep", "SweepError", "check_proxy", "check_start", "make_sampler", "mean_points", "mean_rungs",
           "proxy_config", "space_seeds", "default_out", "JOURNAL"]
