"""``loopnas transfer EXP``: does a finished sweep's order hold when its candidates grow?"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import app
from .common import EngineOpt, OutOpt, UsageError, console, pick_engine


def _scales(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not 0 < v < float("inf") for v in values):
        raise UsageError(f"--scales: give width multiples or parameter targets, e.g. 2,4 or 2,2e5 (got {text!r})")
    return values


def print_transfer(t) -> None:
    from runners.transfer.analysis import extrapolation_sentence
    from runners.transfer.output import SCALE_COLUMNS, candidate_rows, scale_rows

    head, rows = candidate_rows(t)
    table = Table(title=f"{t.space}: {t.metric} at each scale (mean ± s.e., {t.seeds} seeds; unique params)")
    for name in head:
        table.add_column(escape(name))
    for row in rows:
        table.add_row(*(escape(c) for c in row))
    console.print(table)
    table = Table(title="against the base scale")
    for name in SCALE_COLUMNS:
        table.add_column(escape(name))
    for row in scale_rows(t):
        table.add_row(*(escape(c) for c in row))
    console.print(table)
    console.print(f"rules: {t.rules}", markup=False, highlight=False)
    if t.extrapolation is not None:
        console.print(extrapolation_sentence(t.extrapolation), markup=False, highlight=False)
        console.print(t.extrapolation.note, markup=False, highlight=False)
    for note in t.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    console.print(t.verdict, markup=False, highlight=False)


@app.command("transfer")
def transfer_cmd(
    exp: Annotated[Path, typer.Argument(help="A finished sweep's experiment directory.", show_default=False)],
    scales: Annotated[str | None, typer.Option(
        "--scales", help="Width multiples to retrain at, e.g. 2,4, or unique-parameter targets (a number above "
                         "64, e.g. 2e5); 1 retrains the base with --seeds. Default: the space's scales:, else 2,4.",
        show_default=False)] = None,
    steps_rule: Annotated[str, typer.Option("--steps-rule", help="Steps at larger scales: same, tokens-per-param "
                                                                 "(× the parameter growth) or x2 (× 2 per doubling "
                                                                 "of width).")] = "same",
    seeds: Annotated[int | None, typer.Option("--seeds", min=2, help="Seed replicates per candidate (default: the "
                                              "sweep's, else 3).", show_default=False)] = None,
    candidates: Annotated[str, typer.Option("--candidates", help="front (the front plus the best dominated, at "
                                            "least 6; front:N sets that number), top:N or all.")] = "front",
    target: Annotated[float | None, typer.Option("--to", help="Extrapolate each candidate's quality to this many "
                                                 "unique parameters (needs 3 scales, the base counting).",
                                                 show_default=False)] = None,
    engine: EngineOpt = None,
    address: Annotated[str | None, typer.Option("--address", help="Join an existing Ray cluster (auto or host:port).")] = None,
    out: OutOpt = None,
) -> None:
    """Retrain a sweep's chosen candidates at larger widths with its seeds and say whether
    its order holds: per scale, Kendall τ and Spearman ρ against the base with seed
    intervals, and which pairs separated at the base keep their order, flip, or fall
    within noise. Writes OUT/scale-*x/ (experiment directories: rerunning resumes them;
    status and report read them), transfer.json, transfer.md and transfer.png. Default
    OUT: EXP/transfer. The learning rate is unchanged; the steps follow --steps-rule.

    Examples:
      loopnas transfer runs/quickstart
      loopnas transfer runs/quickstart --scales 2,4 --seeds 3 --steps-rule x2
      loopnas transfer runs/mixerloop --candidates top:8 --scales 2,4 --to 1.3e9
      loopnas transfer runs/qs --engine ray --address auto
    """
    from runners.sweep.run import DEFAULT_ENGINE
    from runners.transfer import run_transfer, write
    from runners.transfer.run import TRANSFER

    if target is not None and not 0 < target < float("inf"):
        raise UsageError(f"--to: give a positive parameter count, e.g. 1.3e9 (got {target:g})")
    where = Path(out) if out is not None else Path(exp) / TRANSFER
    try:
        t = run_transfer(exp, out=where, scales=_scales(scales), steps_rule=steps_rule, seeds=seeds,
                         candidates=candidates, engine=pick_engine(engine) or DEFAULT_ENGINE, address=address, target=target)
    except KeyboardInterrupt:
        console.print(f"interrupted: run the same command again to continue ({where})", markup=False, highlight=False)
        raise typer.Exit(130) from None
    paths = write(t, where)
    print_transfer(t)
    console.print(f"transfer: {paths[1]}  ({paths[0].name}, {paths[2].name})", markup=False, highlight=False)
