"""``loopnas train SPEC --task TASK``: train a proxy and print its quality;
``loopnas train --resume DIR``: continue (and optionally extend) the run saved in DIR."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from . import app
from .common import (
    JsonOpt,
    OutOpt,
    SeedOpt,
    SetOpt,
    TaskOpt,
    TokensOpt,
    UsageError,
    console,
    load,
    token_count,
)

StepsOpt = Annotated[int | None, typer.Option(
    "--steps", help="Optimizer steps (default 200 without --tokens).")]


def parse_sets(pairs: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``key=value`` pairs → (trainer fields, task parameters); dotted keys nest."""
    fields: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {pair!r}: expected key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise UsageError(f"--set {pair!r}: the value is not valid YAML") from None
        head, *rest = key.split(".")
        target, path = (params, rest) if head == "task" and rest else (fields, [head, *rest])
        for part in path[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise UsageError(f"--set {pair!r}: {part} is already set to a value")
        target[path[-1]] = value
    return fields, params


def make_config(task: str, steps: int | None, tokens: int | None, seed: int, sets: list[str]):
    """The trainer settings of the command line, checked before anything trains
    (:func:`runners.sweep.preflight.preflight`: the fields, and the task built once)."""
    from nas.errors import SpecError
    from runners.sweep.preflight import preflight
    from runners.tasks import task_names

    if task not in task_names():
        raise UsageError(f"unknown task {task!r}; known tasks: {', '.join(task_names())}")
    fields, params = parse_sets(sets)
    if steps is None and tokens is None and "curriculum" not in fields:
        steps = 200
    data = {"task": task, "steps": steps, "tokens": tokens, "seed": seed,
            "task_params": params, **fields}
    try:
        return preflight(data)
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def resumed(run: Path, spec, task, steps: int | None, tokens: int | None, sets):
    """The arch and config saved with ``run``'s checkpoint, with a new step or token budget."""
    from nas.errors import SpecError
    from nas.spec import stored_spec
    from runners.checkpoint import CHECKPOINT, load
    from runners.sweep.preflight import preflight

    if spec is not None or task is not None or sets:
        raise UsageError("--resume takes the spec and config saved in DIR; give only --steps or --tokens")
    path = run / CHECKPOINT
    if not path.is_file():
        raise UsageError(f"{run}: no {CHECKPOINT} to resume (train with --out DIR to write one)")
    ckpt = load(path)
    if "arch" not in ckpt:
        raise UsageError(f"{path} predates --resume (no saved spec and config); rerun it")
    try:
        config = preflight(ckpt["config"])
    except SpecError as exc:
        raise UsageError(f"{path}: {exc}") from None
    if steps is not None or tokens is not None:
        if steps is not None and steps < ckpt["step"]:
            raise UsageError(f"--steps {steps} is below the {ckpt['step']} steps already run")
        config = config.model_copy(update={"steps": steps, "tokens": tokens})
    return stored_spec(ckpt["arch"]), config


def check_init(path: Path) -> Path:
    """A readable loopnas checkpoint, or a usage error naming what is wrong with it (an
    unloadable file is the CheckpointError that main() prints)."""
    from runners.checkpoint import CheckpointError
    from runners.weights import load_source

    if not path.is_file():
        raise UsageError(f"--init-from {path}: no such file (a checkpoint.pt of a run, a supernet "
                         "or an extracted sub-network)")
    try:
        load_source(path)
    except CheckpointError:
        raise
    except ValueError as exc:  # loadable, but not a spec and weights
        raise UsageError(f"--init-from {path}: {str(exc).splitlines()[0]}") from None
    return path


def report(result) -> Table:
    table = Table(title=escape(f"{result.arch.name} on {result.task}: {result.status}"
                               + (f" ({result.reason})" if result.reason else "")))
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("steps", result.steps), ("tokens", result.tokens), ("params", result.params)]
    if result.curriculum:
        rows.append(("n_max", result.curriculum["n_max"]))
    rows += result.final.items()
    if result.curriculum:
        rows += [(f"acc @ n={n}", acc) for n, acc in result.curriculum["stage_acc"].items()]
    rows += [(f"k={p.k}: {result.quality_metric} / FLOPs per token",
              f"{p.quality:.4f} / {p.compute:.4g}") for p in result.elastic]
    rows.append(("wall time (s)", result.wall_time))
    for name, value in rows:
        table.add_row(escape(str(name)), f"{value:.4f}" if isinstance(value, float) else escape(str(value)))
    return table


@app.command("train")
def train_cmd(
    spec: Annotated[Path | None, typer.Argument(
        help="Architecture spec (.yaml), or the name of a shipped one (e.g. mixerloop_15m); "
             "omit with --resume.", show_default=False)] = None,
    task: TaskOpt = None,  # required unless --resume
    steps: StepsOpt = None,
    tokens: TokensOpt = None,
    out: OutOpt = None,
    as_json: JsonOpt = False,
    seed: SeedOpt = 0,
    sets: SetOpt = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="Continue the run saved in DIR (its checkpoint.pt: spec and config "
                         "included); --steps or --tokens extends it.")] = None,
    init_from: Annotated[Path | None, typer.Option(
        "--init-from", help="Start from the corresponding weights of a checkpoint: a trained "
                            "run's, a one-shot supernet's, or a sub-network extracted from one "
                            "(EXP/trials/<id>/checkpoint.pt).")] = None,
) -> None:
    """Train a proxy of SPEC on a task and report its quality. With --out, a checkpoint is
    written at every evaluation, so an interrupted run continues with --resume.

    Examples:
      loopnas train tiny_noloop --task mqar --steps 300 --set task.vocab_size=32 --set task.seq_len=32
      loopnas train tiny_mixerloop --task state_tracking --set curriculum.stage_steps=300 --json
      loopnas train tiny_elr --task lm --set task.data_files=corpus.txt --tokens 200000 --out runs/elr
      loopnas train --resume runs/elr --tokens 400000
      loopnas train runs/os/trials/t0024/spec.yaml --task mqar --init-from runs/os/trials/t0024/checkpoint.pt
    """
    if steps is not None and tokens is not None:
        raise UsageError("give --steps or --tokens, not both")
    tokens = token_count(tokens)
    if init_from is not None and resume is not None:
        raise UsageError("--resume continues a run with its own weights; drop --init-from")
    if resume is not None:
        arch, config = resumed(resume, spec, task, steps, tokens, sets)
        out = resume
    else:
        if spec is None or task is None:
            raise UsageError("give SPEC and --task (or --resume DIR)")
        arch = load(spec)
        config = make_config(task, steps, tokens, seed, sets or [])
        if out is not None and config.checkpoint_every is None:
            config = config.model_copy(update={"checkpoint_every": config.eval_every})
        if init_from is not None:
            config = config.model_copy(update={"init_from": str(check_init(init_from))})

    import torch

    from runners.checkpoint import CHECKPOINT
    from runners.train import train

    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {config.device!r} requested but CUDA is not available")
    result = train(arch, config, out_dir=out,
                   resume=resume / CHECKPOINT if resume is not None else None)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        console.print(report(result))
    if result.status == "failed":
        raise typer.Exit(1)
