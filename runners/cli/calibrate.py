"""``loopnas calibrate SPACE``: does the proxy separate the candidates this space compares?"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from . import app
from .common import OutOpt, SpaceArg, UsageError, console


def _budgets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not v > 0 for v in values):
        raise UsageError(f"--budgets: give positive multiples of the proxy's budget, e.g. 1,2,4 (got {text!r})")
    return values


def _num(x: float | None, digits: str = ".3g") -> str:
    return "—" if x is None or x != x else format(x, digits)


def print_calibration(cal) -> None:
    table = Table(title=f"{cal.space}: can the proxy see each axis? ({cal.candidates} candidates × "
                        f"{cal.seeds} seeds, {cal.metric})")
    for name in ("parameter", "context", "effect", "s.e.", "p", "separates"):
        table.add_column(name, justify="right" if name in ("effect", "s.e.", "p") else "left")
    for a in cal.axes:
        table.add_row(a.param, "all", _num(a.effect), _num(a.se), _num(a.p_value),
                      "[bold green]yes[/]" if a.separates else "no")
        for c in a.contexts if len(a.contexts) > 1 else []:
            ctx = ", ".join(f"{k}={v}" for k, v in c.context.items())
            table.add_row("", ctx, _num(c.effect), _num(c.se), _num(c.p_value), "yes" if c.separates else "no")
    console.print(table)
    for a in cal.axes:
        console.print(f"{a.param}: {a.verdict}", markup=False, highlight=False)
    for r in cal.rank_agreement:
        console.print(f"rank agreement {r['from']:g}× → {r['to']:g}×: Kendall τ = {_num(r['tau'])} "
                      f"({r['candidates']} candidates)", highlight=False)


@app.command("calibrate")
def calibrate_cmd(
    space: SpaceArg,
    out: OutOpt = None,
    seeds: Annotated[int | None, typer.Option(
        "--seeds", min=2, help="Seed replicates per candidate (default: the space's proxy.seeds when "
                               "above 1, else 3).", show_default=False)] = None,
    budgets: Annotated[str, typer.Option("--budgets", help="Multiples of the proxy's steps to train at, e.g. 1,2,4.")] = "1",
    backend: Annotated[str, typer.Option("--backend", help="optuna: local worker processes; ray: Ray Tune.")] = "optuna",
    address: Annotated[str | None, typer.Option("--address", help="Join an existing Ray cluster (auto or host:port).")] = None,
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
    from runners.sweep.driver import SweepError, default_out

    loaded = load_space(space)
    if loaded.spec.oneshot is not None:
        raise UsageError(f"{space}: calibrate trains stand-alone candidates; a one-shot space scores "
                         "sub-networks of one supernet (calibrate its stand-alone twin instead)")
    where = out or default_out(loaded) / CALIBRATION
    try:
        cal = run_calibration(loaded, Path(where), seeds=seeds or (loaded.spec.proxy.seeds if loaded.spec.proxy.seeds > 1 else 3), budgets=_budgets(budgets),
                              backend=backend, address=address)
    except SweepError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        console.print(f"interrupted: run the same command again to continue ({where})")
        raise typer.Exit(130) from None
    paths = write(cal, Path(where))
    print_calibration(cal)
    console.print(f"calibration: {paths[1]}  ({paths[0].name}, {paths[2].name})", highlight=False)
