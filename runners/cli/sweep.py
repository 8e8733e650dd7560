"""``loopnas sweep SPACE``: search a space; trials train in parallel on Optuna or Ray."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import EngineOpt, OutOpt, SeedsOpt, SpaceArg, UsageError, console, console_err, pick_engine


def check_counts(seeds: int | None, trials: int | None = None) -> None:
    """``--seeds`` and ``--trials`` within the caps a space's own are held to."""
    from nas.proxy import MAX_SEEDS
    from nas.space import MAX_TRIALS

    if seeds is not None and seeds > MAX_SEEDS:
        raise UsageError(f"--seeds {seeds}: at most {MAX_SEEDS} seed replicates per candidate (each is a training run)")
    if trials is not None and trials > MAX_TRIALS:
        raise UsageError(f"--trials {trials}: at most {MAX_TRIALS:,} trials per sweep")


def all_failed(exp: Path) -> str | None:
    """When no trial completed and some failed (raised, timed out, ran out of memory, or its
    candidate was not a valid spec, as a Python space's broken sample() makes every one):
    one line with the counts and the first reason. None: something completed, or every
    candidate only broke a constraint (a verdict on the space, not a failure)."""
    from runners.results.records import read_trials
    from runners.results.status import FAILURES

    records = read_trials(exp, problems=[])
    if any(r.status == "complete" for r in records):
        return None
    bad = [r for r in records if r.status in FAILURES
           or r.status == "infeasible" and (r.reason or "").startswith("invalid spec")]
    if not bad:
        return None
    first = bad[0]
    return (f"no trial completed: {len(bad)} of {len(records)} failed; the first, {first.id} ({first.status}): "
            f"{' '.join((first.reason or first.status).split())[:400]}")


class Tracker(str, Enum):
    """An experiment tracker the driver logs to (``runners.track``), beside search.track."""

    mlflow = "mlflow"
    tensorboard = "tensorboard"
    wandb = "wandb"


TrackOpt = Annotated[list[Tracker] | None, typer.Option(
    "--track", help="Also log to this tracker (repeat for several): mlflow (MLFLOW_TRACKING_URI, else "
                    "OUT/mlflow.db), tensorboard (OUT/tensorboard), wandb (WANDB_MODE=offline: OUT/wandb).",
    metavar="<mlflow|tensorboard|wandb>", show_default=False)]


@app.command("sweep")
def sweep_cmd(
    space: SpaceArg,
    out: OutOpt = None,
    engine: EngineOpt = None,
    trials: Annotated[int | None, typer.Option("--trials", help="Trials to run (default: the space's search.trials).", min=1)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted sweep in --out.")] = False,
    address: Annotated[str | None, typer.Option("--address", help="Join an existing Ray cluster (auto or host:port).")] = None,
    seeds: SeedsOpt = None,
    track: TrackOpt = None,
) -> None:
    """Search a space and write an experiment directory (default runs/<space name>).
    A one-shot space (with a oneshot: section) trains one supernet, then evaluates its
    sub-networks with its weights, each a trial; the front's are extracted with weights.
    Then it checks itself: a spot-check sample trained stand-alone with seeds (OUT/check,
    oneshot.check) says whether the one-shot ranking agrees with stand-alone training.

    Examples:
      loopnas sweep spaces/quickstart.yaml
      loopnas sweep quickstart --engine ray --out runs/qs
      loopnas sweep quickstart --seeds 5 --out runs/qs5
      loopnas sweep quickstart --out runs/qs --resume
      loopnas sweep quickstart --out runs/qs --track mlflow --track tensorboard
      loopnas sweep my_space.yaml --engine ray --address auto
      loopnas sweep spaces/oneshot_placement.yaml --out runs/os
    """
    from nas.space import load_space
    from runners.sweep.driver import default_out
    from runners.report import write_report
    from runners.sweep.run import DEFAULT_ENGINE, run_sweep

    from .report import write_problem

    check_counts(seeds, trials)
    loaded = load_space(space)
    where = out or default_out(loaded)
    again = f"loopnas sweep {space} --out {where} --resume"
    written = []

    def report_once(exp: Path):  # run_sweep writes it for its trackers (when it has any): not twice
        written.append(write_report(exp))
        return written[-1]

    try:
        path = run_sweep(loaded, out=out, engine=pick_engine(engine) or DEFAULT_ENGINE, trials=trials,
                         resume=resume, address=address, seeds=seeds, track=[t.value for t in track or []],
                         report=report_once)
    except KeyboardInterrupt:
        console.print(f"interrupted: continue with  {again}", markup=False, highlight=False)
        raise typer.Exit(130) from None
    except OSError as exc:  # a full disk: every record is whole, so the sweep resumes
        started = (Path(where) / "experiment.json").is_file()
        raise UsageError(write_problem(exc, f"the sweep stopped: a write in {where} failed", f"continue with  {again}"
                                       if started else "run it again")) from None
    from .status import print_status
    print_status(path)
    failed = all_failed(path)
    if failed:
        console_err.print(f"error: {failed}", markup=False, highlight=False)
        raise typer.Exit(1)
    try:
        report = written[-1] if written else write_report(path)
    except OSError as exc:
        raise UsageError(write_problem(exc, f"the sweep is complete, but its report cannot be written in "
                                            f"{path / 'report'}", f"run  loopnas report {path}")) from None
    console.print(f"experiment: {path}   report: {report.index}   (loopnas status {path} · "
                  f"loopnas export {path} --pick knee --out exported)", highlight=False, markup=False)
