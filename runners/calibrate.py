"""``loopnas calibrate``: can this proxy see the differences a space asks about?

Before a sweep, train a fixed design of the space's candidates with K seeds each, at the
proxy's budget and optionally at multiples of it, and ask per parameter whether candidates
that differ only in it differ beyond seed noise.

- **Design**: every point of the space's grid when it has at most ``max_points`` points,
  else one parameter at a time from a reference point (each parameter's first choice; a
  conditional parameter is varied where its ``when`` holds). Each budget is an ordinary
  experiment directory (``budget-1x/`` ...), trained by the sweep driver on either engine,
  so it resumes and ``loopnas status``/``report`` read it.
- **Analysis per parameter p**: a *context* is a setting of the other parameters except
  those conditional on p (so "loop boundary" compares none/block/mixer within each mixer,
  averaging the loop counts that only exist for some boundaries). Within each context every
  level of p is a cell of replicate values, each with its seed. ``effect``: the spread (max −
  min) of the level effects (cell mean − context mean, averaged over contexts); ``se``: the
  standard error of a difference of two level means under seed noise alone (the
  within-candidate variance pooled over all candidates, or, when the test is paired, what is
  left of it after the seed effect); ``p_value``: ``nas.noise.permutation_test``, paired by
  seed when every candidate holds the same seeds (levels shuffled within each (context,
  seed) block), exact where the relabellings can be counted, never below the design's
  floor; ``p_adjusted``: Holm's adjustment over every test this calibration makes (each
  axis and each context, at every budget and loop count: the *family*); ``separates``:
  :data:`RULE` (adjusted p below :data:`ALPHA`, effect above :data:`MIN_SE` s.e.). The same
  per context is in ``contexts``.
- **Output**: calibration.md, the terminal (``loopnas calibrate``) and the report show the
  same :func:`table` and :data:`RULE`.
- **Rank agreement across budgets**: Kendall τ of the candidates' mean quality at the
  first budget against each other budget.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field

from nas.noise import (
    PermutationResult, holm, kendall_tau, p_text, permutation_floor, permutation_test, pooled_variance, seed_effect,
)
from nas.space import Space, _label

CALIBRATION = "calibration"
ALPHA, MIN_SE = 0.01, 3.0
"""The rule an axis must pass to separate (:data:`RULE`, :func:`_separates`): the one place its
numbers are written."""
FAMILY = "every axis and context tested, at every budget and loop count"
RULE = (f"an axis separates when its Holm-adjusted p < {ALPHA:g} (a permutation test, paired by seed where every "
        f"candidate holds the same seeds) and its effect exceeds {MIN_SE:g} standard errors of seed noise")


class Cell(BaseModel):
    level: Any
    values: list[float]
    seeds: list[int] = Field(default_factory=list, description="the seed of each value (same order)")


class Test(BaseModel):
    """How a p-value was obtained (``nas.noise.PermutationResult``)."""

    p_value: float | None = None
    p_upper: float | None = Field(None, description="the upper end of the Monte Carlo interval (= p when exact)")
    p_adjusted: float | None = Field(None, description="Holm-adjusted over the calibration's family of tests "
                                     "(on p_upper)")
    p_floor: float | None = Field(None, description="the smallest p the permutation test can give with this "
                                  "design's replicates (nas.noise.permutation_floor)")
    exact: bool = True
    paired: bool = False
    test: str = ""


class ContextResult(Test):
    context: dict[str, Any]
    effect: float
    se: float
    separates: bool
    cells: list[Cell]


class AxisResult(Test):
    param: str
    levels: list[Any]
    level_effects: dict[str, float] = Field(default_factory=dict)
    effect: float | None = None
    se: float | None = None
    separates: bool = False
    seeds_to_test: int | None = Field(None, description="replicates per cell that let the test go below "
                                      "ALPHA after Holm's adjustment, where p_floor does not")
    interaction_p: float | None = Field(None, description="F test of level × context interaction "
                                        "(normal seed noise assumed); None with one context")
    contexts: list[ContextResult] = Field(default_factory=list)
    verdict: str = ""


class SeedShare(BaseModel):
    share: float = Field(description="the seed effect's share of the seed-to-seed variance")
    p: float = Field(description="F test of a common seed effect across candidates")
    candidates: int
    seeds: int


class BudgetResult(BaseModel):
    multiple: float
    steps: int | None
    dir: str
    axes: list[AxisResult]
    noise_sd: float | None = Field(None, description="seed-to-seed standard deviation, pooled")
    seed_effect: SeedShare | None = Field(None, description="two-way candidate × seed analysis (None: seeds "
                                          "not shared)")
    per_k: dict[str, list[AxisResult]] = Field(default_factory=dict, description="elastic trials: "
                                               "the same analysis at each loop count k they were evaluated at "
                                               "(``axes`` is each replicate's last point)")


class RawValue(BaseModel):
    """One replicate's quality: the record of a calibration from which all of it is recomputed."""

    budget: float
    trial: str
    spec_hash: str
    params: dict[str, Any]
    k: int | None = Field(None, description="an elastic point's loop count (None: the replicate's last point)")
    seed: int
    value: float


def space_key(space: dict[str, Any]) -> str:
    """What defines a space's candidates and their quality (base, parameters, match,
    constraints, objectives, the proxy's task), hashed: a calibration is shown beside an
    experiment only when the keys agree."""
    import hashlib

    proxy = space.get("proxy") or {}
    keep = {k: space.get(k) for k in ("base", "params", "match", "constraints", "objectives")}
    keep["task"] = (proxy.get("task"), proxy.get("task_params"))
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Calibration(BaseModel):
    space: str
    source: str = Field("", description="the space file (the analysis is redone from it and raw)")
    space_key: str = Field("", description="calibrate.space_key of the space calibrated ('': written before "
                           "it was kept)")
    metric: str
    direction: str
    seeds: int
    design: str
    candidates: int
    axes: list[AxisResult]
    budgets: list[BudgetResult]
    rank_agreement: list[dict[str, Any]] = Field(default_factory=list)
    alpha: float = ALPHA
    looks: int = Field(0, description="how many tests the Holm family holds")
    family: str = FAMILY
    raw: list[RawValue] = Field(default_factory=list, description="every replicate value analysed")

    def reanalysed(self, space: Space) -> "Calibration":
        """The same analysis redone from ``raw`` with today's statistics."""
        budgets = tuple(b.multiple for b in self.budgets)
        return analyse_raw(space, self.raw, budgets, self.seeds, self.design, self.candidates,
                           [b.dir for b in self.budgets])


def design(space: Space, max_points: int = 48) -> tuple[str, list[dict[str, Any]]]:
    """The parameter sets to train (as Optuna labels): the full grid, or one at a time."""
    from runners.sweep.study import grid_values

    grid = grid_values(space)
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


def _noise(cands: list) -> tuple[float, float, SeedShare | None]:
    """(pooled within-candidate variance, the same after the seed effect, the seed effect)."""
    variance = pooled_variance([c[2] for c in cands])
    full = [c for c in cands if len(c[3]) >= 2]
    effect = seed_effect([c[2] for c in full], [c[3] for c in full]) if len(full) >= 2 else None
    if effect is None:
        return variance, variance, None
    share = SeedShare(share=effect.share, p=effect.p, candidates=effect.candidates, seeds=effect.seeds)
    return variance, effect.resid_var, share


def _axes(space: Space, cands: list) -> tuple[list[AxisResult], float, SeedShare | None]:
    variance, resid, share = _noise(cands)
    return [analyse_axis(space, name, cands, variance, resid) for name in space.spec.params], variance, share


def analyse_axis(space: Space, name: str, cands: list[tuple[dict, str, list[float], list[int]]],
                 variance: float, resid_variance: float | None = None) -> AxisResult:
    """One parameter's effect, noise and test over the trained candidates (see module doc).
    ``separates`` and the verdict wait for the family's adjustment (:func:`decide`)."""
    levels = [c for c in (space.spec.params[name].choices or ())] or sorted(
        {c[0][name] for c in cands if name in c[0]})
    axis = AxisResult(param=name, levels=list(levels))
    fixed = {p for p, spec in space.spec.params.items() if spec.choices is not None and len(spec.choices) == 1}
    skip = _dependents(space, name) | {name} | fixed  # a one-choice parameter names no context
    contexts: dict[str, dict[str, Cell]] = {}
    shown: dict[str, dict] = {}
    for params, _, values, seeds in cands:
        if name not in params:
            continue
        ctx = {k: v for k, v in params.items() if k not in skip}
        key = _key(ctx)
        shown[key] = ctx
        cell = contexts.setdefault(key, {}).setdefault(_key(params[name]), Cell(level=params[name], values=[]))
        cell.values.extend(values)
        cell.seeds.extend(seeds)
    usable = {k: list(cells.values()) for k, cells in contexts.items() if len(cells) >= 2}
    if len({_key(v) for v in levels}) < 2:
        axis.verdict = "one level: nothing to compare"
        return axis
    if not usable:
        axis.verdict = "no two trained candidates differ only in this parameter"
        return axis
    resid = variance if resid_variance is None else resid_variance
    level_sum: dict[str, list[float]] = {}
    for key, cells in usable.items():
        means = {_key(c.level): sum(c.values) / len(c.values) for c in cells}
        centre = sum(means.values()) / len(means)
        for lv, m in means.items():
            level_sum.setdefault(lv, []).append(m - centre)
        axis.contexts.append(_context(shown[key], cells, variance, resid))
    axis.level_effects = {lv: sum(v) / len(v) for lv, v in level_sum.items()}
    per_level = min(sum(len(c.values) for cells in usable.values() for c in cells if _key(c.level) == lv)
                    for lv in axis.level_effects)
    axis.effect = max(axis.level_effects.values()) - min(axis.level_effects.values())
    result = _test(list(usable.values()))
    axis.se = _se(variance, resid, result.paired, per_level)
    _record(axis, result)
    axis.interaction_p = _interaction(list(usable.values()), result.paired)
    sizes = [[len(c.values) for c in cells] for cells in usable.values()]
    axis.seeds_to_test = None if result.floor < ALPHA else _seeds_needed(sizes, result.paired, ALPHA)
    return axis


def _se(variance: float, resid: float, paired: bool, n: int) -> float | None:
    """The standard error of a difference of two level means of ``n`` replicates each: the
    seed variance (√2 for a difference), after the seed effect when the test is paired."""
    v = resid if paired else variance
    return math.sqrt(2 * v / n) if math.isfinite(v) else None


def _test(contexts: list[list[Cell]]) -> PermutationResult:
    return permutation_test([[c.values for c in cells] for cells in contexts],
                            [[c.seeds for c in cells] for cells in contexts], alpha=ALPHA,
                            thresholds=[ALPHA / j for j in range(2, 33)])  # Holm's steps, for a stable decision


def _record(target: Test, r: PermutationResult) -> None:
    target.p_value, target.p_upper, target.p_floor = r.p, r.p_upper, r.floor
    target.exact, target.paired, target.test = r.exact, r.paired, r.test


def _seeds_needed(sizes: list[list[int]], paired: bool, alpha: float) -> int | None:
    """Replicates per cell at which this design's permutation test can go below ``alpha``."""
    fewest = min(n for cells in sizes for n in cells)
    return next((n for n in range(fewest + 1, 64)
                 if permutation_floor([[n] * len(cells) for cells in sizes], paired=paired) < alpha
                 or permutation_floor([[n] * len(cells) for cells in sizes]) < alpha), None)


def _interaction(contexts: list[list[Cell]], paired: bool) -> float | None:
    """F test of level × context interaction (normal seed noise assumed): do the level
    effects differ between contexts beyond seed noise? None unless ≥ 2 contexts hold the same
    levels with equal replicate counts."""
    from scipy import stats

    import numpy as np

    if len(contexts) < 2:
        return None
    levels = [_key(c.level) for c in contexts[0]]
    n = len(contexts[0][0].values)
    if any(sorted(_key(c.level) for c in cells) != sorted(levels) or any(len(c.values) != n for c in cells)
           for cells in contexts) or n < 2:
        return None
    y = np.array([[sorted(cells, key=lambda c: levels.index(_key(c.level)))[i].values
                   for i in range(len(levels))] for cells in contexts], dtype=float)  # (C, L, n)
    C, L, _ = y.shape
    cell = y.mean(2)
    inter = cell - cell.mean(1, keepdims=True) - cell.mean(0, keepdims=True) + cell.mean()
    ss_int, df_int = n * float((inter ** 2).sum()), (C - 1) * (L - 1)
    if paired:  # residual of the block model within each context: seeds removed
        r = y - cell[:, :, None] - y.mean(1, keepdims=True) + cell.mean(1)[:, None, None]
        ss_res, df_res = float((r ** 2).sum()), C * (L - 1) * (n - 1)
    else:
        ss_res, df_res = float(((y - cell[:, :, None]) ** 2).sum()), C * L * (n - 1)
    if df_res <= 0 or ss_res == 0:
        return None
    return float(stats.f.sf((ss_int / df_int) / (ss_res / df_res), df_int, df_res))


def _context(ctx: dict, cells: list[Cell], variance: float, resid: float) -> ContextResult:
    means = [sum(c.values) / len(c.values) for c in cells]
    n = min(len(c.values) for c in cells)
    result = _test([cells])
    se = _se(variance, resid, result.paired, n)
    out = ContextResult(context=ctx, effect=max(means) - min(means), se=se if se is not None else math.nan,
                        separates=False, cells=cells)
    _record(out, result)
    return out


def _separates(effect: float, se: float | None, p_adjusted: float | None) -> bool:
    return (se is not None and math.isfinite(se) and effect > MIN_SE * se
            and p_adjusted is not None and p_adjusted < ALPHA)


def decide(budgets: list[BudgetResult]) -> int:
    """Holm's adjustment over the family (every axis and context at every budget and loop
    count), then each test's ``separates`` and each axis's verdict; returns the family's size.
    A test repeated on the same values (an axis with one context; an elastic trial's last
    point, which is its point at the largest k) is one test, counted once."""
    family: dict[str, list[Test]] = {}
    for b in budgets:
        for axes in [b.axes, *b.per_k.values()]:
            for a in axes:
                if a.p_value is None:
                    continue
                family.setdefault(_data_key(a.contexts), []).append(a)
                for c in a.contexts:
                    family.setdefault(_data_key([c]), []).append(c)
    groups = list(family.values())
    for group, adj in zip(groups, holm([g[0].p_upper for g in groups])):
        for t in group:
            t.p_adjusted = adj
    for b in budgets:
        for axes in [b.axes, *b.per_k.values()]:
            for a in axes:
                for c in a.contexts:
                    c.separates = _separates(c.effect, c.se, c.p_adjusted)
                if a.effect is not None:
                    a.separates = _separates(a.effect, a.se, a.p_adjusted)
                    a.seeds_to_test = _holm_seeds(a, len(groups))
                    a.verdict = verdict(a, len(groups))
    return len(groups)


def _data_key(contexts: list[ContextResult]) -> str:
    return json.dumps([sorted((_key(c.level), c.values) for c in ctx.cells) for ctx in contexts])


def _holm_seeds(axis: AxisResult, looks: int) -> int | None:
    """Replicates per cell that let this axis's test go below ALPHA / looks (Holm's first
    threshold), where its floor does not; None where it already can."""
    if axis.p_floor is None or axis.p_floor < ALPHA / looks:
        return None
    sizes = [[len(c.values) for c in ctx.cells] for ctx in axis.contexts]
    return _seeds_needed(sizes, axis.paired, ALPHA / looks)


def verdict(axis: AxisResult, looks: int = 1) -> str:
    """The axis's verdict in words, naming the test that gave it."""
    if axis.effect is None:
        return axis.verdict
    size = f"effect {axis.effect:.3g}" + (f" = {axis.effect / axis.se:.1f} s.e." if axis.se else "")
    p = p_text(axis.p_value, axis.p_floor, axis.exact, axis.p_upper)
    test = f"Holm-adjusted p = {axis.p_adjusted:.3g} over {looks} test{'s' if looks != 1 else ''}; {axis.test}"
    if axis.separates:
        out = f"separates: {size}, {p}; {test}"
        if axis.interaction_p is not None and axis.interaction_p < ALPHA:
            out += (f"; the levels interact with the context (interaction F test p = {axis.interaction_p:.2g}, "
                    "normal seed noise assumed): read the per-context rows")
        return out
    if axis.seeds_to_test:
        holm_needs = f", and Holm over {looks} tests needs p < {ALPHA / looks:.2g}" if looks > 1 else ""
        return (f"not separated: the design cannot test it with these replicates: {size}, but its permutation "
                f"test cannot go below p = {axis.p_floor:.2g}{holm_needs}; {axis.seeds_to_test} seeds per "
                f"candidate would let it reach p < {ALPHA:g}")
    big = axis.se and axis.effect > MIN_SE * axis.se
    if big:
        return (f"not separated: {size} of seed noise, but {p}; {test}; the test does not confirm it: "
                "more seeds, or more steps (--budgets 1,2,4 shows whether the effect grows with training)")
    if axis.p_adjusted is not None and axis.p_adjusted < ALPHA:
        return (f"not separated: {p}; {test}; but the effect is under {MIN_SE:g} s.e. of seed noise ({size}): "
                "consistent but small at this budget")
    return f"within seed noise: {size}, {p}; {test}; to see it: more seeds, more steps, or a task on which it matters"


def scaled(space: Space, multiple: float) -> Space:
    """The space at ``multiple`` × its proxy budget, with no early stopping (every
    candidate is trained in full) and rungs scaled with it."""
    from dataclasses import replace

    from nas.proxy import BUDGET

    proxy = space.spec.proxy
    update: dict[str, Any] = {}
    for field in BUDGET:
        if getattr(proxy, field) is not None:
            update[field] = max(1, round(getattr(proxy, field) * multiple))
    if multiple != 1:
        update["eval_every"] = max(1, round(proxy.eval_every * multiple))
    search = space.spec.search.model_copy(update={"early_stopping": None, "sampler": "random",
                                                  "sampler_params": {}})
    spec = space.spec.model_copy(update={"proxy": proxy.model_copy(update=update), "search": search})
    return replace(space, spec=spec)


def run_calibration(space: Space, out: Path, seeds: int = 3, budgets: tuple[float, ...] = (1.0,),
                    engine: str = "optuna", resume: bool = False, address: str | None = None,
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
        run_sweep(scaled(space, b), out=d, engine=engine, resume=exists,
                  address=address, progress=progress, seeds=seeds, planned=plan)
        dirs.append(d)
    return analyse(space, dirs, budgets, seeds, kind, len(plan))


def analyse(space: Space, dirs: list[Path], budgets: tuple[float, ...], seeds: int, kind: str,
            planned: int) -> Calibration:
    """Read each budget's records once and analyse their raw values (:func:`analyse_raw`)."""
    from runners.results.records import read_trials

    quality = next(o for o in space.spec.objectives if o.quality)
    raw = [v for b, d in zip(budgets, dirs) for v in raw_values(read_trials(d), quality.name, b)]
    return analyse_raw(space, raw, budgets, seeds, kind, planned, [str(d) for d in dirs])


def raw_values(records: list, metric: str, multiple: float) -> list[RawValue]:
    """Every complete trial's replicate values: its last point, and each elastic point (k)."""
    out = []
    for r in records:
        if r.status != "complete":
            continue
        for rep in r.replicates:
            ks = sorted({p.k for p in rep.points if p.k is not None})
            chosen = [(None, rep.points[-1])] if rep.points else []
            chosen += [(k, [p for p in rep.points if p.k == k][-1]) for k in ks]
            out += [RawValue(budget=multiple, trial=r.id, spec_hash=r.spec_hash, params=r.params, k=k,
                             seed=rep.seed, value=p.values[metric]) for k, p in chosen]
    return out


def _cands(raw: list[RawValue], k: int | None) -> list[tuple[dict, str, list[float], list[int]]]:
    """(params, spec hash, values, seeds) per trial, at loop count ``k`` (None: last points)."""
    by: dict[str, tuple[dict, str, list[float], list[int]]] = {}
    for v in raw:
        if v.k == k:
            c = by.setdefault(v.trial, (v.params, v.spec_hash, [], []))
            c[2].append(v.value)
            c[3].append(v.seed)
    return list(by.values())


def analyse_raw(space: Space, raw: list[RawValue], budgets: tuple[float, ...], seeds: int, kind: str,
                planned: int, dirs: list[str] | None = None) -> Calibration:
    """The calibration of ``raw`` (``calibration.json`` keeps it: the analysis can be redone
    from the committed file alone, ``Calibration.reanalysed``)."""
    quality = next(o for o in space.spec.objectives if o.quality)
    results, means = [], []
    for i, b in enumerate(budgets):
        mine = [v for v in raw if v.budget == b]
        cands = _cands(mine, None)
        axes, variance, share = _axes(space, cands)
        per_k = {str(k): _axes(space, _cands(mine, k))[0] for k in sorted({v.k for v in mine if v.k is not None})}
        results.append(BudgetResult(multiple=b, steps=scaled(space, b).spec.proxy.steps,
                                    dir=dirs[i] if dirs else "", axes=axes, per_k=per_k,
                                    noise_sd=math.sqrt(variance) if math.isfinite(variance) else None,
                                    seed_effect=share))
        means.append({c[1]: sum(c[2]) / len(c[2]) for c in cands})
    looks = decide(results)
    agreement = []
    for b, m in zip(budgets[1:], means[1:]):
        common = sorted(set(means[0]) & set(m))
        tau = kendall_tau([means[0][h] for h in common], [m[h] for h in common]) if len(common) >= 3 else math.nan
        agreement.append({"from": budgets[0], "to": b, "tau": tau, "candidates": len(common)})
    return Calibration(space=space.name, source=str(space.source), space_key=space_key(space.spec.model_dump(mode="json")),
                       metric=quality.name, direction=quality.direction,
                       seeds=seeds, design=kind, candidates=planned, axes=results[-1].axes, budgets=results,
                       rank_agreement=agreement, looks=looks, raw=raw)


def write(cal: Calibration, out: Path) -> list[Path]:
    """``calibration.json``, ``calibration.md`` and ``calibration.png`` in ``out``."""
    from runners.results.records import write_json, write_text

    paths = [out / "calibration.json", out / "calibration.md", out / "calibration.png"]
    write_json(paths[0], cal)
    write_text(paths[1], markdown(cal))
    figure(cal, paths[2])
    return paths


COLUMNS = ("parameter", "context", "levels: mean ± s.e.", "effect", "s.e.", "p", "p adj.", "separates")


def table(axes: list[AxisResult], strong: Callable[[str], str] = str,
          escape: Callable[[str], str] = str) -> list[tuple[str, ...]]:
    """The calibration table of one budget under :data:`COLUMNS`, as calibration.md, the
    terminal and the report all show it, each in its own markup: per axis a row over all
    contexts, then one per context when there are several, each with its levels' means ±
    standard errors. Every cell goes through ``escape``; an axis row's parameter and a
    "yes" (it separates, by :data:`RULE`) are also ``strong``."""
    out = []
    for a in axes:
        one = a.contexts[0] if len(a.contexts) == 1 else None
        cells = [escape(c) for c in (a.param, "all", levels_text(one) if one else "", _f(a.effect), _f(a.se),
                                     _p(a), _f(a.p_adjusted))]
        out.append((strong(cells[0]), *cells[1:], strong("yes") if a.separates else "no"))
        for c in a.contexts if len(a.contexts) > 1 else []:
            ctx = ", ".join(f"{k}={_label(v)}" for k, v in c.context.items()) or "—"
            out.append((*(escape(x) for x in (a.param, ctx, levels_text(c), _f(c.effect), _f(c.se), _p(c),
                                              _f(c.p_adjusted))), "yes" if c.separates else "no"))
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
             f"({cal.direction}). {RULE[0].upper() + RULE[1:]}. p: the permutation test "
             f"(levels shuffled within each (context, seed) block when paired), exact "
             f"where the relabellings can be counted (`≤` marks the design's floor, `≈` a Monte Carlo estimate, "
             f"decided on its {99}% upper bound); p adj.: Holm over the family of {cal.looks} "
             f"test{'' if cal.looks == 1 else 's'} "
             f"({cal.family}).", ""]
    for b in cal.budgets:
        sd = f"{b.noise_sd:.3g}" if b.noise_sd is not None else "unknown"
        lines += [f"## Budget {b.multiple:g}× ({b.steps} steps; seed-to-seed s.d. {sd})", ""]
        if b.seed_effect is not None:
            se = b.seed_effect
            lines += [f"Seed effect: {se.share:.0%} of the seed-to-seed variance is shared by every candidate "
                      f"on a seed (F test p = {se.p:.2g}, {se.candidates} candidates × {se.seeds} seeds); "
                      "paired tests remove it.", ""]
        sections = [("" if not b.per_k else "At each replicate's last point:", b.axes)]
        sections += [(f"Elastic trials at k = {k}:", axes) for k, axes in b.per_k.items()]
        for title, axes in sections:
            lines += ([title, ""] if title else []) + [
                "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            lines += ["| " + " | ".join(cells) + " |" for cells in table(axes, strong=lambda s: f"**{s}**")]
            lines += [""] + [f"- `{a.param}`: {a.verdict}" for a in axes] + [""]
        lines += _raw_table(cal, b.multiple)
    for r in cal.rank_agreement:
        lines.append(f"Rank agreement {r['from']:g}× → {r['to']:g}×: Kendall τ = {_f(r['tau'])} "
                     f"over {r['candidates']} candidates.")
    return "\n".join(lines) + "\n"


def _raw_table(cal: Calibration, multiple: float) -> list[str]:
    """Every candidate's replicate values by seed (the raw values the tables above come from)."""
    from nas.noise import mean_se

    mine = [v for v in cal.raw if v.budget == multiple]
    if not mine:
        return []
    seeds = sorted({v.seed for v in mine})
    ks = sorted({v.k for v in mine}, key=lambda k: (k is not None, k or 0))
    lines = [f"Per candidate, {cal.metric} by seed" + (" and loop count k (—: the last point)" if len(ks) > 1 else "")
             + ":", "", "| trial | parameters | k | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± s.e. |",
             "|" + "---|" * (4 + len(seeds))]
    trials = {v.trial: v.params for v in mine}
    for t in sorted(trials):
        params = ", ".join(f"{k}={_label(v)}" for k, v in trials[t].items())
        for k in ks:
            at = {v.seed: v.value for v in mine if v.trial == t and v.k == k}
            if not at:
                continue
            m, se = mean_se(list(at.values()))
            cells = [f"{at[s]:.4f}" if s in at else "" for s in seeds]
            lines.append(f"| {t} | {params} | {'—' if k is None else k} | " + " | ".join(cells)
                         + f" | {m:.4f}" + (f" ± {se:.4f}" if math.isfinite(se) else "") + " |")
    return lines + [""]


def _p(t: Test) -> str:
    """A raw p as the table prints it: ``≤ floor`` at the design's floor, ``≈`` when Monte Carlo."""
    if t.p_value is None or not math.isfinite(t.p_value):
        return "—"
    if t.p_floor is not None and t.p_value <= t.p_floor * (1 + 1e-9):
        return f"≤ {t.p_floor:.2g}"
    return ("" if t.exact else "≈ ") + f"{t.p_value:.2g}"


def _f(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3g}"


def figure(cal: Calibration, path: Path) -> Path:
    """Per axis (and context): the effect with MIN_SE s.e. of seed noise drawn beside it."""
    from matplotlib.figure import Figure

    from runners.checkpoint import save_figure

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
    return save_figure(fig, path, dpi=150, facecolor="white")  # never through a symlink at path


def find(exp_dir: Path, space: dict[str, Any] | None = None) -> Calibration | None:
    """The calibration of an experiment's space, when one exists: ``EXP/calibration/`` (read
    bounded: a FIFO, a device or an oversized file is one warning and None). With ``space``
    (the experiment's space as its record holds it), a calibration of another space, or one
    with no budget or an empty cell, is one warning and None."""
    import logging

    from runners.results.records import MAX_EXPERIMENT, read_optional

    path = Path(exp_dir) / CALIBRATION / "calibration.json"
    cal = read_optional(path, Calibration, MAX_EXPERIMENT)
    if cal is None:
        return None
    why = ""
    if not cal.budgets:
        why = "it holds no budget"
    elif any(not c.values for axes in [cal.axes, *(x for b in cal.budgets for x in [b.axes, *b.per_k.values()])]
             for a in axes for ctx in a.contexts for c in ctx.cells):
        why = "a cell holds no values"
    elif space is not None and cal.space_key and cal.space_key != space_key(space):
        why = f"it calibrates another space ({cal.space}: its base, parameters or proxy differ)"
    if why:
        logging.getLogger("loopnas.records").warning("warning: %s: not shown (%s)", path, why)
        return None
    return cal


__all__ = ["ALPHA", "CALIBRATION", "COLUMNS", "MIN_SE", "RULE", "space_key", "table", "Calibration", "RawValue", "analyse", "analyse_raw", "design", "find", "markdown", "run_calibration",
           "scaled", "write"]
