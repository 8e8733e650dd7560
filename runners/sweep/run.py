"""``run_sweep``: a space in, an experiment directory out, on the chosen engine."""
from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from nas.space import Space, load_space
from runners.results.status import SHOWN

from .driver import Sweep, default_out

ENGINES = ("optuna", "ray")
DEFAULT_ENGINE = "optuna"  # one machine: no Ray start-up; see benchmarks/bench_sweep.py


class _Watched(dict):
    """The driver's records, remembering which were written (``Sweep._write``) since the
    progress line last looked."""

    def __init__(self, records: dict):
        super().__init__(records)
        self.dirty = set(records)

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.dirty.add(key)


class _Line:
    """The progress line: counts by status and the front of the replicate means (no
    bootstrap: p_front is shown by status, report and the end of the sweep), kept up to
    date from the records written since the last message, so a message costs the same at
    10 candidates as at 10,000. Its front and order are the experiment's
    (``runners.results.front``: ``non_dominated``, ``in_cost_order``)."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        sweep.records = self.records = _Watched(sweep.records)
        self.objectives = sweep.objectives
        self.names = [o.name for o in sweep.objectives]
        self.directions = [o.direction for o in sweep.objectives]
        self.status: dict[str, str] = {}
        self.tally = dict.fromkeys(SHOWN, 0)  # every status but running
        self.running: set[str] = set()
        self.placed: dict[str, list[tuple]] = {}  # record id -> its point keys
        self.points: dict[tuple, dict[str, float]] = {}  # (number, point index, id, k) -> its values
        self.front: dict[tuple, dict[str, float]] = {}

    def counts(self) -> dict[str, int]:
        """``Sweep.counts``, from the records written since the last call."""
        stale = False
        while self.records.dirty:
            stale |= self._take(self.records[self.records.dirty.pop()])
        if stale:  # a front member was rewritten (rare): rank every point again
            self.front = self._front(self.points)
        return {**self.tally, "running": sum(1 for rid in self.running  # interrupted ones are queued again
                                             if rid in self.sweep.active or self.records[rid].duplicate_of)}

    def text(self, c: dict[str, int]) -> str:
        from runners.results.front import in_cost_order

        best = in_cost_order(sorted(self.front), self.objectives, self.front.get)
        shown = ", ".join(f"{k[2]}{'' if k[3] is None else f'@k={k[3]}'}" for k in best[:6])
        parts = [f"{c['complete']} complete", f"{c['running']} running"]
        parts += [f"{c[s]} {s}" for s in SHOWN[2:] if c[s]]
        return " · ".join(parts) + (f" │ front: {shown}" if shown else "")

    def _take(self, record) -> bool:
        """Count ``record`` anew and place its points; True when the front must be ranked again."""
        from runners.results.front import finite_values

        old = self.status.get(record.id)
        if old is not None and old != "running":
            self.tally[old] -= 1
        self.running.discard(record.id)
        self.status[record.id] = record.status
        if record.status == "running":
            self.running.add(record.id)
        else:
            self.tally[record.status] += 1
        stale = False
        for k in self.placed.pop(record.id, ()):
            self.points.pop(k)
            stale |= self.front.pop(k, None) is not None
        if record.status != "complete":
            return stale
        keys = self.placed[record.id] = []
        for n, p in enumerate(record.points):
            if finite_values(p.values, self.names):
                key = (record.number, n, record.id, p.k)
                self.points[key] = p.values
                keys.append(key)
        if not stale and keys:  # the front with these points: O(front), whatever the sweep's size
            self.front = self._front({**self.front, **{k: self.points[k] for k in keys}})
        return stale

    def _front(self, points: dict[tuple, dict[str, float]]) -> dict[tuple, dict[str, float]]:
        from runners.results.front import non_dominated

        keys = list(points)
        values = [[points[k][n] for n in self.names] for k in keys]
        return {keys[i]: points[keys[i]] for i in non_dominated(values, self.directions)} if keys else {}


def _bar(console: Console, progress: bool) -> Progress:
    """The sweep's progress bar: name, bar, done/total, elapsed, the counts and front line.
    The name and line are user text (space and trial names): never read as markup."""
    return Progress(TextColumn("{task.fields[name]}", style="bold", markup=False), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}", markup=False),
                    console=console, disable=not progress, transient=False)


def run_sweep(space: Space | str | Path, out: str | Path | None = None, engine: str = DEFAULT_ENGINE,
              trials: int | None = None, resume: bool = False, address: str | None = None,
              progress: bool = True, seeds: int | None = None, planned: list[dict] | None = None,
              track: list[str] | None = None, report: Callable[[Path], Any] | None = None) -> Path:
    """Run (or ``resume``) a sweep on ``engine``; returns the experiment directory. ``seeds`` overrides
    the space's ``proxy.seeds`` (replicates per candidate); ``planned``: a fixed list of
    parameter sets to train instead of sampling (``loopnas calibrate``); ``track``: trackers
    beside the space's ``search.track`` (``runners.track``), given the report ``report(out)``
    writes (``runners.report.write_report``) once the sweep has ended."""
    from runners.track import BACKENDS as TRACKERS

    from .driver import SweepError

    space = space if isinstance(space, Space) else load_space(space)
    if engine not in ENGINES:
        raise SweepError(f"--engine must be one of {', '.join(ENGINES)} (got {engine!r})")
    if address and engine != "ray":
        raise SweepError("--address joins a Ray cluster: use it with --engine ray")
    if set(track or []) - set(TRACKERS):
        raise SweepError(f"--track must be one of {', '.join(TRACKERS)} (got {', '.join(track)})")
    out = Path(out) if out is not None else default_out(space)
    if engine == "ray":  # a cluster that does not answer: one line, before the directory is made
        from .devices import ray_resources
        from .ray_engine import check_address
        ray_resources(space.spec.search.resources)
        check_address(address)
    if space.spec.oneshot is not None:
        return _oneshot(space, out, engine, trials, resume, progress, address)
    sweep = Sweep(space, out, engine, trials=trials, resume=resume, seeds=seeds, planned=planned, track=track)
    console = Console(stderr=True)
    if progress:
        console.print(f"{space.name}: experiment {out} · study {sweep.where}", markup=False, highlight=False,
                      soft_wrap=True)
    bar = _bar(console, progress)
    with closing(sweep), bar:  # closing: the directory is released however the sweep ends
        task = bar.add_task("", total=sweep.total, name=space.name)
        line = _Line(sweep)

        def on_change() -> None:
            c = line.counts()
            done = sum(c[s] for s in sweep.final)
            bar.update(task, completed=min(sweep.total, done), description=line.text(c))

        on_change()
        try:
            if engine == "ray":
                from .ray_engine import run_ray
                run_ray(sweep, address=address, on_change=on_change)
            else:
                from .local import run_local
                run_local(sweep, on_change=on_change)
        except Exception:  # a pool or a cluster that cannot start: a rerun starts afresh
            sweep.abandon_unstarted()
            raise
        on_change()
        sweep.end(_report(report, out) if sweep.tracking.active else None)
    return out


def _report(write: Callable[[Path], Any] | None, out: Path) -> Path | None:
    """The directory of the report ``write`` makes for the trackers (``Report.index``'s), or
    None (a failure is one warning)."""
    import logging

    if write is None:
        return None
    try:
        return write(out).index.parent
    except Exception as exc:
        logging.getLogger("loopnas.track").warning("warning: the report for the trackers cannot be written (%s)", exc)
        return None


def _oneshot(space: Space, out: Path, engine: str, trials: int | None, resume: bool, progress: bool,
             address: str | None) -> Path:
    """A one-shot space: one supernet trained here, sub-networks evaluated here (see
    :mod:`runners.oneshot.search`), recorded by the same driver; then its self-check trains
    a spot-check sample stand-alone on ``engine`` (:mod:`runners.oneshot.check`)."""
    from runners.oneshot.check import run_check
    from runners.oneshot.search import planned, run_oneshot
    from runners.oneshot.supernet import OneShotError, eval_task, supernet_config

    from .driver import SweepError

    try:
        eval_task(space, supernet_config(space))
    except OneShotError as exc:
        raise SweepError(str(exc)) from None
    # sub-networks are scored with the supernet's weights: one evaluation, no seeds
    sweep = Sweep(space, out, "oneshot", trials=trials or planned(space), resume=resume, seeds=1)
    console = Console(stderr=True)
    console.print(f"{space.name}: training the supernet ({out / 'supernet'}) · study {sweep.where}",
                  markup=False, highlight=False)
    bar = _bar(console, progress)
    task = bar.add_task("", total=sweep.total, name=f"{space.name} evaluations", start=False)
    line = _Line(sweep)

    def on_change() -> None:
        if not bar.tasks[0].started:
            bar.start()
            bar.start_task(task)
        c = line.counts()
        bar.update(task, completed=min(sweep.total, c["complete"] + c["duplicate"]), description=line.text(c))

    try:
        try:
            run_oneshot(sweep, out, progress=progress, on_change=on_change)
        finally:
            bar.stop()
        if progress:
            console.print(f"{space.name}: self-check, the spot-check sample trained stand-alone ({out / 'check'})",
                          markup=False, highlight=False)
        try:
            check = run_check(space, list(sweep.records.values()), sweep.objectives, out, engine, address, progress)
        except OneShotError as exc:
            raise SweepError(str(exc)) from None
        console.print(f"one-shot self-check: {check['verdict']}", markup=False, highlight=False, soft_wrap=True)
    finally:
        sweep.close()
    return out


__all__ = ["run_sweep", "ENGINES", "DEFAULT_ENGINE"]
