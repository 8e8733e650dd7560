"""``loopnas calibrate SPACE``: does the proxy separate the candidates this space compares?"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import app
from .common import EngineOpt, OldEngineOpt, OutOpt, SpaceArg, UsageError, console, pick_engine


def _budgets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not v > 0 for v in values):
        raise UsageError(f"--budgets: give positive multiples of the proxy's budget, e.g. 1,2,4 (got {text!r})")
    return values


def print_calibration(cal) -> None:
    from runners.calibrate import COLUMNS, rows

    tables = [(b, k, axes) for b in cal.budgets for k, axes in [(None, b.axes), *b.per_k.items()]]
    for budget, k, axes in tables:
        at = "" if k is None else f", elastic trials at k = {k}"
        table = Table(title=f"{cal.space}: can the proxy see each axis? ({cal.candidates} candidates × "
                            f"{cal.seeds} seeds, {cal.metric}, {budget.steps} steps{at})")
        for name in COLUMNS:
            table.add_column(name, justify="right" if name in ("effect", "s.e.", "p") else "left")
        for axis_row, cells in rows(axes):
            if axis_row:
                cells = (*(escape(c) for c in cells[:-1]), "[bold green]yes[/]" if cells[-1] == "yes" else "no")
            else:
                cells = ("", *(escape(c) for c in cells[1:]))
            table.add_row(*cells)
        console.print(table)
    for a in cal.axes:
        console.print(f"{a.param}: {a.verdict}", markup=False, highlight=False)
    for r in cal.rank_agreement:
        tau = "—" if r["tau"] is None or r["tau"] != r["tau"] else f"{r['tau']:.3g}"
        console.print(f"rank agreement {r['from']:g}× → {r['to']:g}×: Kendall τ = {tau} "
                      f"({r['candidates']} candidates)", highlight=False)


@app.command("calibrate")
def calibrate_cmd(
    space: SpaceArg,
    out: OutOpt = None,
    seeds: Annotated[int | None, typer.Option(
        "--seeds", min=2, help="Seed replicates per candidate (default: the space's proxy.seeds when "
                               "above 1, else 3).", show_default=False)] = None,
    budgets: Annotated[str, typer.Option("--budgets", help="Multiples of the proxy's steps to train at, e.g. 1,2,4.")] = "1",
    engine: EngineOpt = None,
    address: Annotated[str | None, typer.Option("--address", help="Join an existing Ray cluster (auto or host:port).")] = None,
    backend: OldEngineOpt = None,
) -> None:
    """Train every candidate of a space's grid (or one parameter at a time, for large
    spaces) with several seeds, and say per parameter whether candidates that differ only
    in it differ beyond seed noise (permutation test, p < 0.01 and effect > 3 s.e.).
    Writes OUT/budget-*x/ (experiment directories; rerunning resumes them),
    calibration.json, calibration.md and calibration.png. Default OUT:
    runs/<space name>/calibration, where a sweep's report finds it.

    Examples:
      loopnas calibrate quickstart
      loopnas calibrate spaces/mixerloop.yaml --seeds 4 --budgets 1,2
    """
    from nas.space import load_space
    from runners.calibrate import CALIBRATION, run_calibration, write
    from runners.sweep.driver import default_out
    from runners.sweep.run import DEFAULT_BACKEND

    loaded = load_space(space)
    if loaded.spec.oneshot is not None:
        raise UsageError(f"{space}: calibrate trains stand-alone candidates; a one-shot space scores "
                         "sub-networks of one supernet (calibrate its stand-alone twin instead)")
    where = out or default_out(loaded) / CALIBRATION
    try:
        cal = run_calibration(loaded, Path(where), seeds=seeds or (loaded.spec.proxy.seeds if loaded.spec.proxy.seeds > 1 else 3), budgets=_budgets(budgets),
                              backend=pick_engine(engine, backend) or DEFAULT_BACKEND, address=address)
    except KeyboardInterrupt:
        console.print(f"interrupted: run the same command again to continue ({where})")
        raise typer.Exit(130) from None
    paths = write(cal, Path(where))
    print_calibration(cal)
    console.print(f"calibration: {paths[1]}  ({paths[0].name}, {paths[2].name})", highlight=False)
