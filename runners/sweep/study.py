"""The sweep's Optuna study: its storage and sampler, asking, telling, the constraints a
trial carries, the budget as a shared study counts it, and recovery after a crash.

The driver (:class:`.driver.Sweep`) is the study's only user; what it tells is decided from
a trial record, through the one mapping of a status to Optuna's ``TrialState``
(:func:`runners.results.status.optuna_state`)."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

from nas.errors import LoopnasError
from nas.proxy import sampler_class
from nas.space import MAX_GRID, Space, _label, grid_points, param_points
from runners.results.records import JOURNAL, Objective, TrialRecord, repair_journal, study_storage
from runners.results.status import Status, optuna_state
from runners.track import annotate

ID, RESUME = "loopnas_id", "loopnas_resume"  # user attributes: the record id of an enqueued trial, a rerun


class SweepError(LoopnasError):
    """A sweep cannot start (a usage problem): one line, exit code 2."""


def make_sampler(space: Space, trials: int):
    """An Optuna sampler by name (:func:`nas.proxy.sampler_class`), sized for small sweeps
    (TPE's 10 start-up trials and NSGA-II's population of 50 would make a small sweep pure
    random search)."""
    import optuna

    search = space.spec.search
    name, params = search.sampler.lower(), dict(search.sampler_params)
    seed = params.pop("seed", search.seed)
    if name == "tpe":
        params.setdefault("n_startup_trials", max(2, min(10, trials // 4)))
    elif name == "nsga2":
        params.setdefault("population_size", max(4, min(50, trials // 3)))
    elif name == "grid":
        grid = params.pop("search_space", None) or grid_values(space)
        return _grid_sampler()(grid, seed=seed, **params)
    cls = getattr(optuna.samplers, sampler_class(search.sampler) or search.sampler, None)
    if cls is None:
        raise SweepError(f"search.sampler: optuna has no sampler {search.sampler!r}")
    return cls(seed=seed, **params)


def grid_values(space: Space) -> dict[str, list]:
    """Every parameter's grid values: as many as :func:`nas.space.param_points` counts."""
    if space.sample_fn is not None:
        raise SweepError("search.sampler: grid over a Python space needs sampler_params.search_space")
    size = grid_points(space.spec)  # counted before anything is listed
    if size is not None and size > MAX_GRID:
        raise SweepError(f"search.sampler: a grid of more than {MAX_GRID:,} points cannot be listed")
    grid = {}
    for name, p in space.spec.params.items():
        n = param_points(p)
        if n is None:
            raise SweepError(f"params.{name}: a grid needs finite choices (give step for a float range)")
        if p.kind == "categorical":
            grid[name] = [_label(c) for c in p.choices]
        elif p.kind == "int":
            grid[name] = [int(p.low) + i * int(p.step or 1) for i in range(n)]
        else:
            grid[name] = [p.low + i * p.step for i in range(n)]
    return grid


def _grid_sampler():
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        """Optuna's grid, without its ``study.stop()`` once the grid is exhausted: that
        works only inside ``study.optimize``, and the driver's budget ends the sweep."""

        def after_trial(self, study, trial, state, values) -> None:
            pass

    return GridSampler


def fill(objective) -> float:
    """A poor value for a measured objective of a trial that never ran (serving bytes and
    milliseconds can exceed the 1e9 that is poor for a loss)."""
    if objective.direction == "maximize":
        return 0.0
    return 1e18 if objective.serving else 1e9


class StudyAdapter:
    """One experiment's study. ``final``: the statuses that use the budget."""

    def __init__(self, space: Space, out: Path, objectives: list[Objective], total: int, final: tuple[str, ...]):
        import optuna

        self.space, self.out, self.objectives, self.total, self.final = space, out, objectives, total, final
        self.shared = bool(space.spec.search.storage)  # an RDB other drivers may share
        self.storage = self._storage(space.spec.search.storage)
        self.sampler = make_sampler(space, total)
        self.study = optuna.create_study(
            storage=self.storage, sampler=self.sampler, study_name=space.spec.name, load_if_exists=True,
            directions=[o.direction for o in space.spec.objectives])
        with warnings.catch_warnings():  # experimental since Optuna 3.2, still in 5.0
            warnings.simplefilter("ignore")
            self.study.set_metric_names([o.name for o in objectives])

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

    def plan(self, planned: list[dict]) -> None:
        """A fixed design (calibration): its points, asked in order."""
        for params in planned:
            self.study.enqueue_trial(params, skip_if_exists=False)

    def ask(self):
        """The next trial to gate, or None where a shared study's budget is already spent by
        trials numbered before it (:meth:`_withdrawn`)."""
        trial = self.study.ask()
        return None if self._withdrawn(trial) else trial

    @staticmethod
    def constrain(trial, violated) -> None:
        """Each (constraint, violation > 0 if violated) on the trial itself, where Optuna's
        constraint-aware samplers (TPE, NSGA-II, GP, ...) and ``best_trials`` read it
        (``Trial.set_constraint``; the samplers' ``constraints_func`` is deprecated)."""
        for i, (c, v) in enumerate(violated):
            trial.set_constraint(f"{i}: {c.text}", max(0.0, v))

    def tell(self, trial, record: TrialRecord, original: TrialRecord | None,
             cost: Callable[[TrialRecord, object], float]) -> None:
        """Tell the study what became of the trial of ``record`` (a duplicate: as its
        ``original`` ended). ``cost(record, objective)``: a cost-model objective's value."""
        trial.set_user_attr("loopnas", {"id": record.id, "status": record.status,
                                        "duplicate_of": record.duplicate_of})
        annotate(trial, record, self.out)  # what the Optuna dashboard shows of it
        status = original.status if original is not None else record.status
        main = record.points[-1].values if record.points else None
        if status == Status.COMPLETE and main is not None:
            self.study.tell(trial, [main[o.name] for o in self.objectives])
        elif status == Status.INFEASIBLE and self.space.constraints and record.arch is not None and any(
                o.measured for o in self.objectives):
            # constraint-aware samplers learn the infeasible region from complete trials
            # whose constraints are > 0; plain Optuna's best_trials leaves them out.
            values = {o.name: fill(o) if o.measured else cost(record, o) for o in self.space.spec.objectives}
            self.study.tell(trial, [values[o.name] for o in self.objectives])
        else:  # a complete trial with no finite point is told as failed
            self.study.tell(trial, state=optuna_state(Status.FAILED if status == Status.COMPLETE else status))

    def used(self, below: int | None = None) -> int:
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

    def _withdrawn(self, trial) -> bool:
        """On a shared RDB, drivers that ask at the same moment could overshoot the budget:
        trials are ranked by number, and one that finds the budget spent by the trials
        numbered before it is withdrawn (told FAIL, never trained)."""
        if not self.shared or self.used(trial.number) < self.total:
            return False
        import optuna

        trial.set_user_attr("loopnas", {"id": None, "status": "withdrawn", "duplicate_of": None})
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return True

    def waiting(self) -> bool:
        """Whether an enqueued trial waits to be asked."""
        import optuna

        return bool(self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))

    def recover(self, records: dict[str, TrialRecord]) -> None:
        """After a crash: trials left running are failed in the study and queued again with
        the same parameters; the re-run keeps its id and resumes from its checkpoint."""
        import optuna

        TS = optuna.trial.TrialState
        states = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        running = {r.number for r in records.values() if r.status == Status.RUNNING}
        recorded = {r.number for r in records.values()}
        # asked but never recorded (its first record write hit a full disk, or a kill came
        # first): asked again with its parameters, so a grid point is not lost. Only with the
        # journal: on a shared RDB, trials without a record here are other drivers'.
        lost = [] if self.shared else [t for t in states.values() if t.state == TS.RUNNING and t.number not in recorded]
        for number, t in states.items():
            if t.state == TS.RUNNING:
                self.study.tell(number, state=TS.FAIL)
        queued = {t.user_attrs.get(ID) for t in states.values() if t.state == TS.WAITING}
        for r in records.values():
            if r.number in running and r.number in states and r.id not in queued:
                self.study.enqueue_trial(states[r.number].params, user_attrs={ID: r.id, RESUME: True},
                                         skip_if_exists=False)
        for t in lost:
            rid, params = t.user_attrs.get(ID) or f"t{t.number:04d}", self._placed(t)
            if rid not in queued and params:  # none: the trial never held a point, so none is lost
                self.study.enqueue_trial(params, user_attrs={ID: rid}, skip_if_exists=False)

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


def record_id(trial) -> str:
    """The record id of a trial: the one it was enqueued under, else ``t<number>``."""
    return trial.user_attrs.get(ID) or f"t{trial.number:04d}"


__all__ = ["StudyAdapter", "SweepError", "make_sampler", "grid_values", "record_id", "fill", "ID", "RESUME"]
