"""``loopnas calibrate SPACE``: does the proxy separate the candidates this space compares?"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from nas.errors import LoopnasError

from . import app
from .common import EngineOpt, OutOpt, SpaceArg, UsageError, console, console_err, pick_engine


MAX_BUDGETS = 8
"""The most budgets one calibration trains at: each is the whole design again."""
MAX_MULTIPLE = 64.0
"""The largest multiple of the proxy's budget a calibration trains at."""


def _budgets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not 0 < v < math.inf for v in values):
        raise UsageError(f"--budgets: give positive multiples of the proxy's budget, e.g. 1,2,4 (got {text[:60]!r})")
    if len(values) > MAX_BUDGETS:
        raise UsageError(f"--budgets: {len(values)} budgets, at most {MAX_BUDGETS} (each trains the whole design)")
    if len(set(values)) < len(values):
        raise UsageError(f"--budgets: {text[:60]!r} repeats a budget; give each once")
    top = max(values)
    if top > MAX_MULTIPLE:
        raise UsageError(f"--budgets: {top:g}× the proxy's budget is past {MAX_MULTIPLE:g}×; give multiples "
                         f"of at most {MAX_MULTIPLE:g}")
    return values


def _check_budgets(space, budgets: tuple[float, ...]) -> None:
    """Each budget's proxy run within the trainer's caps (``proxy.steps``, ``proxy.tokens``)."""
    from nas.proxy import MAX_STEPS, MAX_TOKENS

    proxy = space.spec.proxy
    for field, cap in (("steps", MAX_STEPS), ("tokens", MAX_TOKENS)):
        value = getattr(proxy, field)
        for b in budgets:
            if value is not None and round(value * b) > cap:
                raise UsageError(f"--budgets {b:g}: {b:g} × proxy.{field} ({value:,}) is {round(value * b):,} "
                                 f"{field}, past the cap of {cap:,}")


def _one_candidate(space) -> str | None:
    """Why a calibration of ``space`` would compare nothing (its design is one candidate),
    said before anything trains; None: it compares."""
    from runners.calibrate import design

    kind, plan = design(space)
    if len(plan) >= 2:
        return None
    return (f"{space.source}: the space has one candidate, so calibrate has nothing to compare; give a "
            "parameter two or more choices")


def _all_failed(cal) -> str | None:
    """One line when, at some budget, no trial completed and some failed (the sweep's rule,
    :func:`runners.cli.sweep.all_failed`): the budget's directory, the counts and the first
    reason. None: every budget has a completed trial."""
    from .sweep import all_failed

    for budget in cal.budgets:
        failed = budget.dir and all_failed(Path(budget.dir))
        if failed:
            return f"{budget.dir}: {failed}; nothing to calibrate"
    return None


def print_calibration(cal) -> None:
    from runners.calibrate import COLUMNS, RULE, table

    tables = [(b, k, axes) for b in cal.budgets for k, axes in [(None, b.axes), *b.per_k.items()]]
    for budget, k, axes in tables:
        at = "" if k is None else f", elastic trials at k = {k}"
        shown = Table(title=f"{cal.space}: can the proxy see each axis? ({cal.candidates} candidates × "
                            f"{cal.seeds} seeds, {cal.metric}, {budget.steps} steps{at})")
        for name in COLUMNS:
            shown.add_column(name, justify="right" if name in ("effect", "s.e.", "p") else "left")
        for cells in table(axes, strong=lambda s: f"[bold]{s}[/]", escape=escape):
            shown.add_row(*cells)
        console.print(shown)
    console.print(f"{RULE[0].upper() + RULE[1:]} (Holm over {cal.looks} tests).", markup=False, highlight=False)
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
) -> None:
    """Train every candidate of a space's grid (or one parameter at a time, for large
    spaces) with several seeds, and say per parameter whether candidates that differ only
    in it differ beyond seed noise.

    The test: a permutation test paired by seed, exact where countable, Holm-adjusted over
    every test made; an axis separates when its adjusted p and its effect in standard errors
    of seed noise pass the rule printed with the tables. Writes OUT/budget-*x/ (experiment directories; rerunning resumes them),
    calibration.json, calibration.md and calibration.png. Default OUT:
    runs/<space name>/calibration, where a sweep's report finds it.

    Examples:
      loopnas calibrate quickstart
      loopnas calibrate spaces/mixerloop.yaml --seeds 4 --budgets 1,2
    """
    from nas.space import load_space
    from runners.calibrate import CALIBRATION, run_calibration, write
    from runners.sweep.driver import default_out
    from runners.sweep.run import DEFAULT_ENGINE

    from .sweep import check_counts

    check_counts(seeds)
    multiples = _budgets(budgets)
    loaded = load_space(space)
    if loaded.spec.oneshot is not None:
        raise UsageError(f"{space}: calibrate trains stand-alone candidates; a one-shot space scores "
                         "sub-networks of one supernet (calibrate its stand-alone twin instead)")
    _check_budgets(loaded, multiples)
    if (why := _one_candidate(loaded)) is not None:
        raise UsageError(why)
    where = Path(out or default_out(loaded) / CALIBRATION)
    made = [p for p in (where, *where.parents) if not os.path.lexists(p)]
    try:
        cal = run_calibration(loaded, where, seeds=seeds or (loaded.spec.proxy.seeds if loaded.spec.proxy.seeds > 1 else 3), budgets=multiples,
                              engine=pick_engine(engine) or DEFAULT_ENGINE, address=address)
    except KeyboardInterrupt:
        console.print(f"interrupted: run the same command again to continue ({where})")
        raise typer.Exit(130) from None
    except LoopnasError:  # refused at start: the directories this run made go again once empty
        for folder in made:
            if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    failed = _all_failed(cal)
    if failed:  # nothing to analyse: say why instead of a calibration of no values (issue #34)
        console_err.print(f"error: {failed}", markup=False, highlight=False)
        raise typer.Exit(1)
    paths = write(cal, Path(where))
    print_calibration(cal)
    console.print(f"calibration: {paths[1]}  ({paths[0].name}, {paths[2].name})", highlight=False)
