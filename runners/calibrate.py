"""``loopnas calibrate``: can this proxy see the differences a space asks about?

Before a sweep, train a fixed design of the space's candidates with K seeds each, at the
proxy's budget and optionally at multiples of it, and ask per parameter whether candidates
that differ only in it differ beyond seed noise.

- **Design**: every point of the space's grid when it has at most ``max_points`` points,
  else one parameter at a time from a reference point (each parameter's first choice; a
  conditional parameter is varied where its ``when`` holds). Each budget is an ordinary
  experiment directory (``budget-1x/`` ...), trained by the sweep driver on either backend,
  so it resumes and ``loopnas status``/``report`` read it.
- **Analysis per parameter p**: a *context* is a setting of the other parameters except
  those conditional on p (so "loop boundary" compares none/block/mixer within each mixer,
  averaging the loop counts that only exist for some boundaries). Within each context every
  level of p is a cell of replicate values. ``effect``: the spread (max − min) of the level
  effects (cell mean − context mean, averaged over contexts); ``se``: the standard error
  of a difference of two level means under seed noise alone (the within-candidate variance
  pooled over all candidates); ``p_value``: a permutation test of "p makes no difference"
  (values shuffled across levels within each context, ``nas.noise.permutation_test``);
  ``separates``: p < 0.01 and effect > 3 s.e. The same per context is in ``contexts``.
- **Rank agreement across budgets**: Kendall τ of the candidates' mean quality at the
  first budget against each other budget.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from nas.noise import kendall_tau, permutation_floor, permutation_test, pooled_variance
from nas.space import Space, _label

CALIBRATION = "calibration"
ALPHA, MIN_SE = 0.01, 3.0


class Cell(BaseModel):
    level: Any
    values: list[float]


class ContextResult(BaseModel):
    context: dict[str, Any]
    effect: float
    se: float
    p_value: float
    separates: bool
    cells: list[Cell]


class AxisResult(BaseModel):
    param: str
    levels: list[Any]
    level_effects: dict[str, float] = Field(default_factory=dict)
    effect: float | None = None
    se: float | None = None
    p_value: float | None = None
    separates: bool = False
    p_floor: float | None = Field(None, description="the smallest p the permutation test can give "
                                  "with this design's replicates (nas.noise.permutation_floor)")
    seeds_to_test: int | None = Field(None, description="replicates per cell that let the test go "
                                      "below ALPHA, where p_floor does not")
    contexts: list[ContextResult] = Field(default_factory=list)
    verdict: str = ""


class BudgetResult(BaseModel):
    multiple: float
    steps: int | None
    dir: str
    axes: list[AxisResult]
    noise_sd: float | None = Field(None, description="seed-to-seed standard deviation, pooled")
    per_k: dict[str, list[AxisResult]] = Field(default_factory=dict, description="elastic trials: "
                                               "the same analysis at each loop count k they were evaluated at "
                                               "(``axes`` is each replicate's last point)")


class Calibration(BaseModel):
    space: str
    metric: str
    direction: str
    seeds: int
    design: str
    candidates: int
    axes: list[AxisResult]
    budgets: list[BudgetResult]
    rank_agreement: list[dict[str, Any]] = Field(default_factory=list)


def design(space: Space, max_points: int = 48) -> tuple[str, list[dict[str, Any]]]:
    """The parameter sets to train (as Optuna labels): the full grid, or one at a time."""
    from runners.sweep.driver import _grid

    grid = _grid(space)
    size = math.prod(len(v) for v in grid.values())
    if size <= max_points:
        return "full grid", [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    ref = {name: values[0] for name, values in grid.items()}
    points = []
    for name, values in grid.items():
        base = dict(ref)
        for other, allowed in space.spec.params[name].when.items():
            base[other] = _label(allowed[0])  # where the parameter is active
        points += [{**base, name: v} for v in values]
    unique = {json.dumps(p, sort_keys=True): p for p in points}
    return "one parameter at a time", list(unique.values())


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _dependents(space: Space, name: str) -> set[str]:
    """Parameters active only for some values of ``name`` (transitively)."""
    out, frontier = set(), {name}
    while frontier:
        nxt = {p for p, spec in space.spec.params.items() if set(spec.when) & frontier and p not in out}
        out |= nxt
        frontier = nxt
    return out


def _candidates(records: list, metric: str, k: int | None = None) -> list[tuple[dict, str, list[float]]]:
    """(params, spec hash, replicate qualities) per complete trial record: each replicate's
    last point, or with ``k`` its point at that loop count (an elastic trial's curve)."""
    out = []
    for r in records:
        if r.status != "complete":
            continue
        if k is None:
            values = [rep.points[-1].values[metric] for rep in r.replicates if rep.points]
        else:
            values = [p.values[metric] for rep in r.replicates for p in rep.points if p.k == k]
        if values:
            out.append((r.params, r.spec_hash, values))
    return out


def _loop_counts(records: list) -> list[int]:
    """The loop counts elastic trials were evaluated at (empty: no elastic trial)."""
    return sorted({p.k for r in records if r.status == "complete"
                   for rep in r.replicates for p in rep.points if p.k is not None})


def _axes(space: Space, cands: list, seeds: int) -> tuple[list[AxisResult], float]:
    variance = pooled_variance([v for _, _, v in cands])
    axes = [analyse_axis(space, name, cands, variance) for name in space.spec.params]
    for a in axes:
        a.verdict = verdict(a, seeds)
    return axes, variance


def analyse_axis(space: Space, name: str, cands: list[tuple[dict, str, list[float]]],
                 variance: float) -> AxisResult:
    """One parameter's effect, noise and test over the trained candidates (see module doc)."""
    levels = [c for c in (space.spec.params[name].choices or ())] or sorted(
        {c[0][name] for c in cands if name in c[0]})
    axis = AxisResult(param=name, levels=list(levels))
    fixed = {p for p, spec in space.spec.params.items() if spec.choices is not None and len(spec.choices) == 1}
    skip = _dependents(space, name) | {name} | fixed  # a one-choice parameter names no context
    contexts: dict[str, dict[str, list[float]]] = {}
    shown: dict[str, dict] = {}
    for params, _, values in cands:
        if name not in params:
            continue
        ctx = {k: v for k, v in params.items() if k not in skip}
        key = _key(ctx)
        shown[key] = ctx
        contexts.setdefault(key, {}).setdefault(_key(params[name]), []).extend(values)
    usable = {k: cells for k, cells in contexts.items() if len(cells) >= 2}
    if len({_key(v) for v in levels}) < 2:
        axis.verdict = "one level: nothing to compare"
        return axis
    if not usable:
        axis.verdict = "no two trained candidates differ only in this parameter"
        return axis
    level_sum: dict[str, list[float]] = {}
    for key, cells in usable.items():
        means = {lv: sum(v) / len(v) for lv, v in cells.items()}
        centre = sum(means.values()) / len(means)
        for lv, m in means.items():
            level_sum.setdefault(lv, []).append(m - centre)
        axis.contexts.append(_context(shown[key], cells, variance))
    axis.level_effects = {lv: sum(v) / len(v) for lv, v in level_sum.items()}
    per_level = min(sum(len(cells.get(lv, [])) for cells in usable.values()) for lv in axis.level_effects)
    axis.effect = max(axis.level_effects.values()) - min(axis.level_effects.values())
    axis.se = math.sqrt(2 * variance / per_level) if math.isfinite(variance) else None
    axis.p_value = permutation_test([list(c.values()) for c in usable.values()])
    axis.separates = _separates(axis.effect, axis.se, axis.p_value)
    axis.p_floor = permutation_floor([[len(v) for v in cells.values()] for cells in usable.values()])
    if axis.p_floor >= ALPHA:
        fewest = min(len(v) for cells in usable.values() for v in cells.values())
        axis.seeds_to_test = next(n for n in range(fewest + 1, 64) if permutation_floor(
            [[n] * len(cells) for cells in usable.values()]) < ALPHA)
    return axis


def _context(ctx: dict, cells: dict[str, list[float]], variance: float) -> ContextResult:
    means = [sum(v) / len(v) for v in cells.values()]
    n = min(len(v) for v in cells.values())
    se = math.sqrt(2 * variance / n) if math.isfinite(variance) else math.nan
    p = permutation_test([list(cells.values())])
    effect = max(means) - min(means)
    return ContextResult(context=ctx, effect=effect, se=se, p_value=p, separates=_separates(effect, se, p),
                         cells=[Cell(level=json.loads(lv), values=v) for lv, v in cells.items()])


def _separates(effect: float, se: float | None, p: float) -> bool:
    return se is not None and math.isfinite(se) and effect > MIN_SE * se and p < ALPHA


def verdict(axis: AxisResult, seeds: int) -> str:
    if axis.effect is None:
        return axis.verdict
    if axis.separates:
        return f"separates: effect {axis.effect:.3g} = {axis.effect / axis.se:.1f} s.e., p = {axis.p_value:.3g}"
    if axis.seeds_to_test and axis.se and axis.effect > MIN_SE * axis.se:
        return (f"beyond seed noise but not testable with these replicates: effect {axis.effect:.3g} = "
                f"{axis.effect / axis.se:.1f} s.e., but a permutation test of this design cannot go "
                f"below p = {axis.p_floor:.2g} (it gave {axis.p_value:.3g}); {axis.seeds_to_test} seeds "
                f"per candidate would let it reach p < {ALPHA:g}")
    if axis.se and axis.effect > MIN_SE * axis.se:
        return (f"not separated: effect {axis.effect:.3g} = {axis.effect / axis.se:.1f} s.e. of seed noise, but "
                f"p = {axis.p_value:.3g} (the levels do not differ consistently across contexts and seeds); "
                "to see it: more seeds; more steps (--budgets 1,2,4 shows whether the effect grows with training)")
    advice = []
    if axis.se and axis.effect > 0:
        need = math.ceil(seeds * (MIN_SE * axis.se / axis.effect) ** 2)
        if need > seeds:
            advice.append(f"about {need} seeds would put {MIN_SE:g} s.e. under this effect if it is real")
    advice += ["more steps (--budgets 1,2,4 shows whether the effect grows with training)",
               "or a task on which this parameter matters"]
    return (f"within seed noise: effect {axis.effect:.3g} ± {axis.se or math.nan:.2g} s.e., "
            f"p = {axis.p_value:.3g}; to see it: " + "; ".join(advice))


def scaled(space: Space, multiple: float) -> Space:
    """The space at ``multiple`` × its proxy budget, with no early stopping (every
    candidate is trained in full) and rungs scaled with it."""
    from dataclasses import replace

    proxy = space.spec.proxy
    update: dict[str, Any] = {}
    for field in ("steps", "tokens"):
        if getattr(proxy, field) is not None:
            update[field] = max(1, round(getattr(proxy, field) * multiple))
    if multiple != 1:
        update["eval_every"] = max(1, round(proxy.eval_every * multiple))
    search = space.spec.search.model_copy(update={"early_stopping": None, "sampler": "random",
                                                  "sampler_params": {}})
    spec = space.spec.model_copy(update={"proxy": proxy.model_copy(update=update), "search": search})
    return replace(space, spec=spec)


def run_calibration(space: Space, out: Path, seeds: int = 3, budgets: tuple[float, ...] = (1.0,),
                    backend: str = "optuna", resume: bool = False, address: str | None = None,
                    max_points: int = 48, progress: bool = True) -> Calibration:
    """Train the design at every budget (resuming what exists) and analyse it."""
    from runners.sweep.driver import SweepError
    from runners.sweep.lock import LockError, check_place
    from runners.sweep.run import run_sweep

    quality = next((o for o in space.spec.objectives if o.quality), None)
    if quality is None:
        raise SweepError(f"{space.source}: calibrate needs a measured quality objective (acc, eval_loss, ...)")
    kind, plan = design(space, max_points)
    try:  # the sweep's own checks of an output place, before anything is written
        check_place(out)
        out.mkdir(parents=True, exist_ok=True)
    except LockError as exc:
        raise SweepError(str(exc)) from None
    except OSError as exc:
        raise SweepError(f"--out {out}: cannot make this directory ({exc.strerror}); "
                         "choose a directory of your own") from None
    dirs = []
    for b in budgets:
        d = out / f"budget-{b:g}x"
        exists = (d / "experiment.json").is_file()
        run_sweep(scaled(space, b), out=d, backend=backend, resume=exists,
                  address=address, progress=progress, seeds=seeds, planned=plan)
        dirs.append(d)
    return analyse(space, dirs, budgets, seeds, kind, len(plan))


def analyse(space: Space, dirs: list[Path], budgets: tuple[float, ...], seeds: int, kind: str,
            planned: int) -> Calibration:
    from runners.sweep.records import read_trials

    quality = next(o for o in space.spec.objectives if o.quality)
    results, means = [], []
    for b, d in zip(budgets, dirs):
        records = read_trials(d)  # once per budget: every analysis below reads these
        cands = _candidates(records, quality.name)
        axes, variance = _axes(space, cands, seeds)
        per_k = {str(k): _axes(space, _candidates(records, quality.name, k), seeds)[0]
                 for k in _loop_counts(records)}
        scaled_proxy = scaled(space, b).spec.proxy
        results.append(BudgetResult(multiple=b, steps=scaled_proxy.steps, dir=str(d), axes=axes, per_k=per_k,
                                    noise_sd=math.sqrt(variance) if math.isfinite(variance) else None))
        means.append({h: sum(v) / len(v) for _, h, v in cands})
    agreement = []
    for b, m in zip(budgets[1:], means[1:]):
        common = sorted(set(means[0]) & set(m))
        tau = kendall_tau([means[0][h] for h in common], [m[h] for h in common]) if len(common) >= 3 else math.nan
        agreement.append({"from": budgets[0], "to": b, "tau": tau, "candidates": len(common)})
    return Calibration(space=space.name, metric=quality.name, direction=quality.direction, seeds=seeds,
                       design=kind, candidates=planned, axes=results[-1].axes, budgets=results,
                       rank_agreement=agreement)


def write(cal: Calibration, out: Path) -> list[Path]:
    """``calibration.json``, ``calibration.md`` and ``calibration.png`` in ``out``."""
    from runners.sweep.records import write_json, write_text

    paths = [out / "calibration.json", out / "calibration.md", out / "calibration.png"]
    write_json(paths[0], cal)
    write_text(paths[1], markdown(cal))
    figure(cal, paths[2])
    return paths


COLUMNS = ("parameter", "context", "levels: mean ± s.e.", "effect", "s.e.", "p", "separates")


def rows(axes: list[AxisResult]) -> list[tuple[bool, tuple[str, ...]]]:
    """The calibration table of one budget (the markdown's and the terminal's): per axis a
    row over all contexts (``True``: the axis row), then one per context when there are
    several, each with its levels' means ± standard errors."""
    out = []
    for a in axes:
        one = a.contexts[0] if len(a.contexts) == 1 else None
        out.append((True, (a.param, "all", levels_text(one) if one else "", _f(a.effect), _f(a.se),
                           _f(a.p_value), "yes" if a.separates else "no")))
        for c in a.contexts if len(a.contexts) > 1 else []:
            ctx = ", ".join(f"{k}={_label(v)}" for k, v in c.context.items()) or "—"
            out.append((False, (a.param, ctx, levels_text(c), _f(c.effect), _f(c.se), _f(c.p_value),
                                "yes" if c.separates else "no")))
    return out


def levels_text(c: ContextResult) -> str:
    """``none 0.766 ± 0.020 · block 0.953 ± 0.011``: each level's replicate mean ± s.e."""
    from nas.noise import mean_se

    parts = []
    for cell in c.cells:
        m, se = mean_se(cell.values)
        parts.append(f"{_label(cell.level)} {m:.3f}" + (f" ± {se:.3f}" if math.isfinite(se) else ""))
    return " · ".join(parts)


def markdown(cal: Calibration) -> str:
    lines = [f"# Calibration of `{cal.space}`", "",
             f"{cal.candidates} candidates ({cal.design}) × {cal.seeds} seeds; metric `{cal.metric}` "
             f"({cal.direction}). An axis *separates* when p < {ALPHA:g} (permutation test) and its "
             f"effect exceeds {MIN_SE:g} standard errors of seed noise.", ""]
    for b in cal.budgets:
        sd = f"{b.noise_sd:.3g}" if b.noise_sd is not None else "unknown"
        lines += [f"## Budget {b.multiple:g}× ({b.steps} steps; seed-to-seed s.d. {sd})", ""]
        sections = [("" if not b.per_k else "At each replicate's last point:", b.axes)]
        sections += [(f"Elastic trials at k = {k}:", axes) for k, axes in b.per_k.items()]
        for title, axes in sections:
            lines += ([title, ""] if title else []) + [
                "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            for axis_row, cells in rows(axes):
                if axis_row:
                    cells = (f"**{cells[0]}**", *cells[1:-1], "**yes**" if cells[-1] == "yes" else "no")
                lines.append("| " + " | ".join(cells) + " |")
            lines += [""] + [f"- `{a.param}`: {a.verdict}" for a in axes] + [""]
    for r in cal.rank_agreement:
        lines.append(f"Rank agreement {r['from']:g}× → {r['to']:g}×: Kendall τ = {_f(r['tau'])} "
                     f"over {r['candidates']} candidates.")
    return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3g}"


def figure(cal: Calibration, path: Path) -> Path:
    """Per axis (and context): the effect with 3 s.e. of seed noise drawn beside it."""
    from matplotlib.figure import Figure

    rows = []
    for a in cal.axes:
        if a.effect is None:
            continue
        rows.append((f"{a.param}", a.effect, a.se or 0.0, a.separates))
        for c in a.contexts if len(a.contexts) > 1 else []:
            ctx = ", ".join(f"{k}={v}" for k, v in c.context.items())[:40]
            rows.append((f"  {a.param} | {ctx}", c.effect, c.se if math.isfinite(c.se) else 0.0, c.separates))
    fig = Figure(figsize=(8, 0.9 + 0.42 * max(1, len(rows))))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r[1] for r in rows], color=["#d62728" if r[3] else "#9aa7b8" for r in rows])
    ax.scatter([MIN_SE * r[2] for r in rows], ys, marker="|", s=300, color="black", zorder=3,
               label=f"{MIN_SE:g} s.e. of seed noise")
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=8)
    ax.set_xlabel(f"effect on {cal.metric} (spread of level means)")
    ax.set_title(f"{cal.space}: which axes the proxy separates ({cal.seeds} seeds; red: separates)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=150, facecolor="white")
    return path


def find(exp_dir: Path) -> Calibration | None:
    """The calibration of an experiment's space, when one exists: ``EXP/calibration/``."""
    path = Path(exp_dir) / CALIBRATION / "calibration.json"
    if not path.is_file():
        return None
    try:
        return Calibration.model_validate_json(path.read_text())
    except ValueError:
        return None


__all__ = ["CALIBRATION", "Calibration", "analyse", "design", "find", "markdown", "run_calibration",
           "scaled", "write"]
