"""``loopnas diagnose RUN --out DIR``: what each loop iteration of a trained proxy contributes."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import SeedOpt, SetOpt, TaskOpt, UsageError, console

RunArg = Annotated[Path, typer.Argument(help="A trainer output dir or sweep trial dir "
                                        "(checkpoint.pt + result.json), or a checkpoint file.",
                                        show_default=False)]
DiagOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output directory (summary.json, *.png).")]
SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Architecture spec, when the run has none saved.")]
DataOpt = Annotated[Path | None, typer.Option("--data", help="A text file, probed with the lm task.")]
BatchesOpt = Annotated[int | None, typer.Option("--batches", help="Eval batches (default: the "
                                                "run's own eval batches; 2 of 32 on another task).",
                                                show_default=False)]
ProbesOpt = Annotated[int | None, typer.Option("--probes", help="Gaussian probes per position for "
                                               "the influence Jacobian (default: exact).")]


@app.command("diagnose")
def diagnose_cmd(run: RunArg, out: DiagOutOpt, spec: SpecOpt = None, task: TaskOpt = None,
                 data: DataOpt = None, sets: SetOpt = None, batches: BatchesOpt = None,
                 probes: ProbesOpt = None, seed: SeedOpt = 0) -> None:
    """Context-closed interventions, truncation, cross-position influence and per-loop traces.

    Examples:

      loopnas diagnose runs/diag_mixer --out runs/diag_mixer/diagnose

      loopnas diagnose runs/sweep/trials/t0003 --data notes.txt --set task.seq_len=64 --out d
    """
    from runners.diagnose import diagnose, load_run

    from .train import parse_sets

    fields, params = parse_sets(sets or [])
    if fields:
        raise UsageError(f"--set takes task parameters only (task.key=value), got {', '.join(fields)}")
    if data is not None:
        if task not in (None, "lm"):
            raise UsageError("--data probes with the lm task; drop --task")
        task, params = "lm", {"data_files": str(data), **params}
    if params and task is None:
        raise UsageError("--set task.* needs --task or --data")
    try:
        loaded = load_run(run, spec=spec, task=task, task_params=params)
    except (FileNotFoundError, ValueError, TypeError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    summary = diagnose(loaded, out, batches=batches, seed=seed, probes=probes)
    console.print(f"{summary['arch']} on {summary['task']}: {len(summary['interventions'])} "
                  f"interventions, {len(summary['truncation'])} loop counts; wrote {out}/summary.json, "
                  + ", ".join(summary["plots"]))
