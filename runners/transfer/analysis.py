"""Does a proxy's order survive growth? The analysis of ``loopnas transfer``.

Per scale, every candidate's quality (mean ± s.e. over the sweep's seeds) beside its cost
at that scale, and against the base scale:

- **Rank agreement**: Kendall τ and Spearman ρ of the candidates' means, each with a 95%
  percentile interval from a paired bootstrap (seed indices resampled jointly across
  candidates, and across the two scales when they hold the same seeds: a seed fixes the
  data order at every scale).
- **Pairs**: a bare τ would call a reshuffle of within-noise candidates a failure to
  transfer. Every pair that differs beyond seed noise at the base (``nas.noise.compare``,
  p < ``TIE_ALPHA``) is *kept* (same sign, p < TIE_ALPHA at the scale), *flipped*
  (opposite sign, p < TIE_ALPHA) or *within noise*; the pairs that were within noise at
  the base are counted as still within noise or newly separated.
- **Front** at each scale (candidates' means over every objective) and one verdict.
- **Extrapolation** (three or more scales, a target): each candidate's quality fitted as a
  straight line in ln(unique parameters) and carried to the target, marked extrapolated.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from nas.noise import TIE_ALPHA, compare, kendall_tau, mean_se, tau_ci

DRAWS, LEVEL, BOOT_SEED = 2000, 0.95, 0
Outcome = Literal["kept", "flipped", "within_noise", "newly_separated", "still_within_noise"]


class CandidateResult(BaseModel):
    trial: str = Field(description="the base trial")
    k: int | None = Field(None, description="loop count (elastic trials), None: the spec's own")
    label: str
    mean: float | None = None
    se: float | None = None
    n: int = 0
    seeds: list[int] = Field(default_factory=list)
    values: list[float] = Field(default_factory=list, description="one per seed, in the order of seeds")
    unique_params: float | None = None
    projection_flops: float | None = None
    objectives: dict[str, float] = Field(default_factory=dict, description="every objective's mean")
    summary: str | None = None
    status: str = "missing"
    scaled_trial: str | None = Field(None, description="its trial in this scale's directory")


class PairResult(BaseModel):
    a: str
    b: str
    base_diff: float | None
    base_p: float | None
    diff: float | None
    p: float | None
    test: str
    outcome: Outcome


class Pairs(BaseModel):
    separated: int = Field(0, description="pairs separated beyond seed noise at the base scale")
    kept: int = 0
    flipped: int = 0
    within_noise: int = 0
    unseparated: int = Field(0, description="pairs within noise (or noise unknown) at the base scale")
    still_within_noise: int = 0
    newly_separated: int = 0
    detail: list[PairResult] = Field(default_factory=list)


class ScaleResult(BaseModel):
    scale: float = Field(description="the width multiple (geometric mean over the candidates)")
    label: str = Field("", description="as asked: 2x (a width multiple) or 2e5 (a unique-parameter target)")
    params_multiple: float = Field(1.0, description="unique-parameter growth (geometric mean)")
    dir: str
    steps: int | None = None
    tokens: int | None = None
    lr: float | None = None
    steps_multiple: float = 1.0
    seeds: list[int] = Field(default_factory=list)
    candidates: list[CandidateResult]
    tau: float | None = None
    tau_ci: tuple[float, float] | None = None
    spearman: float | None = None
    spearman_ci: tuple[float, float] | None = None
    compared: int = Field(0, description="candidates complete at this and the base scale")
    pairs: Pairs = Field(default_factory=Pairs)
    front: list[str] = Field(default_factory=list)
    verdict: str = ""


class Prediction(BaseModel):
    label: str
    slope: float
    intercept: float
    params: float
    predicted: float
    lo: float
    hi: float


class Extrapolation(BaseModel):
    extrapolated: bool = True
    target: float
    model: str
    candidates: list[Prediction]
    order: list[str]
    unresolved: list[tuple[str, str]]
    note: str


class Transfer(BaseModel):
    experiment: str
    space: str
    metric: str
    direction: str
    seeds: int
    base: str = Field(description="where the base scale's numbers come from")
    candidates_rule: str
    lr_rule: str
    steps_rule: str
    rules: str = Field(description="the learning-rate and step rules, in words")
    alpha: float = TIE_ALPHA
    scales: list[ScaleResult]
    verdict: str
    extrapolation: Extrapolation | None = None
    notes: list[str] = Field(default_factory=list)


def _f(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


@dataclass
class Measured:
    """One candidate at one scale, read from its records (:mod:`runners.transfer.run`)."""

    label: str
    trial: str
    k: int | None
    by_seed: dict[int, float] = field(default_factory=dict)
    objectives: dict[str, float] = field(default_factory=dict)
    unique_params: float | None = None
    projection_flops: float | None = None
    summary: str | None = None
    status: str = "missing"
    scaled_trial: str | None = None

    def result(self) -> CandidateResult:
        seeds = sorted(self.by_seed)
        values = [self.by_seed[s] for s in seeds]
        mean, se = mean_se(values) if values else (math.nan, math.nan)
        return CandidateResult(trial=self.trial, k=self.k, label=self.label, mean=_f(mean), se=_f(se),
                               n=len(values), seeds=seeds, values=values, unique_params=self.unique_params,
                               projection_flops=self.projection_flops, objectives=self.objectives,
                               summary=self.summary, status=self.status, scaled_trial=self.scaled_trial)


def rank_agreement(a: np.ndarray, b: np.ndarray, joint: bool, draws: int = DRAWS,
                   seed: int = BOOT_SEED) -> tuple[float, tuple, float, tuple]:
    """τ and ρ between the row means of ``a`` and ``b`` (candidates × seeds), each with its
    ``LEVEL`` interval from resampling seeds (``nas.noise.tau_ci``; with ``joint`` the same
    seed columns on both sides)."""
    if len(a) < 2:
        return kendall_tau(a.mean(1), b.mean(1)), (math.nan, math.nan), math.nan, (math.nan, math.nan)
    r = tau_ci(a, b, draws=draws, seed=seed, level=LEVEL, joint=joint)
    return r.tau, (r.lo, r.hi), r.rho, (r.rho_lo, r.rho_hi)


def classify(base_test, test) -> Outcome:
    """One pair's outcome at a scale given its test at the base (see the module docstring)."""
    now = test.separated()
    if base_test.separated():
        if not now:
            return "within_noise"
        return "kept" if np.sign(test.diff) == np.sign(base_test.diff) else "flipped"
    return "newly_separated" if now else "still_within_noise"


def pairs(base: dict[str, Measured], scale: dict[str, Measured], labels: list[str]) -> Pairs:
    out = Pairs()
    for a, b in itertools.combinations(labels, 2):
        t0 = _test(base[a], base[b])
        t1 = _test(scale[a], scale[b])
        outcome = classify(t0, t1)
        out.detail.append(PairResult(a=a, b=b, base_diff=_f(t0.diff), base_p=_f(t0.p), diff=_f(t1.diff),
                                     p=_f(t1.p), test=t1.test, outcome=outcome))
        setattr(out, outcome, getattr(out, outcome) + 1)
    out.separated = out.kept + out.flipped + out.within_noise
    out.unseparated = out.still_within_noise + out.newly_separated
    return out


def _test(a: Measured, b: Measured):
    sa, sb = sorted(a.by_seed), sorted(b.by_seed)
    return compare([a.by_seed[s] for s in sa], [b.by_seed[s] for s in sb], sa, sb)


def front_labels(measured: list[Measured], objectives: list) -> list[str]:
    """The candidates on the Pareto front of their means at one scale, in cost order."""
    from nas.pareto import pareto_front
    from runners.results.front import cost_key

    names = [o.name for o in objectives]
    done = [m for m in measured if m.status == "complete" and all(
        math.isfinite(m.objectives.get(n, math.nan)) for n in names)]
    if not done:
        return []
    idx = pareto_front([[m.objectives[n] for n in names] for m in done], [o.direction for o in objectives])
    key = cost_key(objectives)
    return [m.label for m in sorted((done[i] for i in idx), key=lambda m: m.objectives[key])]


def compare_scale(result: ScaleResult, base: list[Measured], scale: list[Measured]) -> ScaleResult:
    """``result`` with τ, ρ, their intervals and the pairs against the base scale."""
    b, s = {m.label: m for m in base}, {m.label: m for m in scale}
    labels = [m.label for m in base if m.status == "complete" and m.by_seed
              and m.label in s and s[m.label].status == "complete" and s[m.label].by_seed]
    result.compared = len(labels)
    if len(labels) < 2:
        return result
    sb, ss = _common_seeds([b[x] for x in labels]), _common_seeds([s[x] for x in labels])
    a = np.array([[b[x].by_seed[q] for q in sb] for x in labels])
    c = np.array([[s[x].by_seed[q] for q in ss] for x in labels])
    tau, tau_ci, rho, rho_ci = rank_agreement(a, c, joint=sb == ss)
    result.tau, result.spearman = _f(tau), _f(rho)
    result.tau_ci = (_f(tau_ci[0]), _f(tau_ci[1])) if math.isfinite(tau_ci[0]) else None
    result.spearman_ci = (_f(rho_ci[0]), _f(rho_ci[1])) if math.isfinite(rho_ci[0]) else None
    result.pairs = pairs(b, s, labels)
    return result


def reanalysed(t: Transfer) -> Transfer:
    """The same transfer's statistics redone from the per-seed values it holds (each scale's
    candidates' ``seeds`` and ``values``): τ, ρ, their intervals, the pairs, the verdicts and
    any extrapolation, with today's ``nas.noise``; the fronts (means only) are kept."""
    def measured(r: ScaleResult) -> list[Measured]:
        return [Measured(label=c.label, trial=c.trial, k=c.k, by_seed=dict(zip(c.seeds, c.values)),
                         objectives=dict(c.objectives), unique_params=c.unique_params,
                         projection_flops=c.projection_flops, summary=c.summary, status=c.status,
                         scaled_trial=c.scaled_trial) for c in r.candidates]

    base = measured(t.scales[0])
    results = [compare_scale(t.scales[0].model_copy(deep=True), base, base)]
    p = results[0].pairs
    results[0].verdict = f"{p.separated} of {p.separated + p.unseparated} pairs differ beyond seed noise at the base"
    for r in t.scales[1:]:
        again = compare_scale(r.model_copy(deep=True), base, measured(r))
        again.verdict = scale_verdict(again, t.direction)
        results.append(again)
    out = t.model_copy(update={"scales": results, "verdict": overall_verdict(results, t.direction)})
    if t.extrapolation is not None:
        out.extrapolation = extrapolate(results, t.extrapolation.target, t.direction)
    return out


def _common_seeds(measured: list[Measured]) -> list[int]:
    common = set.intersection(*(set(m.by_seed) for m in measured))
    return sorted(common)




def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def interval(ci) -> str:
    return "" if ci is None else f", 95% CI {ci[0]:.2f}–{ci[1]:.2f}"


def shown(label: str) -> str:
    """A scale's label as printed: ``2×`` for a width multiple, ``2e5`` for a target."""
    return label[:-1] + "×" if label.endswith("x") else label


def where(r: ScaleResult) -> str:
    """``at 2× width``, or for a parameter target ``at 2e5 parameters (3.1× width)``."""
    if r.label.endswith("x"):
        return f"at {r.label[:-1]}× width"
    return f"at {r.label} parameters ({r.scale:.2g}× width)"


def scale_verdict(r: ScaleResult, direction: str) -> str:
    """One sentence: does the base order hold at this scale, pair by pair?"""
    at = where(r)
    if r.compared < 2:
        return f"{at}: {_n(r.compared, 'candidate')} complete at both scales, nothing to compare yet" + _unfinished(r)
    p = r.pairs
    tau = "τ = —" if r.tau is None else f"τ = {r.tau:.2f}{interval(r.tau_ci)}"
    if p.separated == 0:
        head = (f"the base scale separates none of its {_n(p.unseparated, 'pair')} beyond seed noise, so there "
                f"is no order to carry {at} ({tau})")
    elif p.flipped == 0:
        head = f"the base order holds {at} ({tau}); "
        if p.within_noise == 0:
            head += f"all {_n(p.separated, 'separated pair')} keep their order"
        else:
            head += (f"{p.within_noise} of {_n(p.separated, 'separated pair')} "
                     f"{'is' if p.within_noise == 1 else 'are'} now within noise, none flips")
    else:
        worst = next(d for d in p.detail if d.outcome == "flipped")
        better = worst.a if (worst.base_diff > 0) == (direction == "maximize") else worst.b
        other = worst.b if better == worst.a else worst.a
        head = (f"the base order does not hold {at} ({tau}): {p.flipped} of {_n(p.separated, 'separated pair')} "
                f"{'flips' if p.flipped == 1 else 'flip'} beyond noise ({better} was ahead of {other}, "
                f"now behind), {p.kept} {'keeps its' if p.kept == 1 else 'keep their'} order"
                + (f", {p.within_noise} now within noise" if p.within_noise else ""))
    if p.unseparated and p.separated:
        head += (f"; of the {_n(p.unseparated, 'pair')} within noise at the base, "
                 + (f"{p.newly_separated} now {'separates' if p.newly_separated == 1 else 'separate'}"
                    if p.newly_separated else "all still are"))
    elif p.separated == 0 and p.newly_separated:
        head += f"; {p.newly_separated} of them now {'separates' if p.newly_separated == 1 else 'separate'}"
    return head + _unfinished(r)


def _unfinished(r: ScaleResult) -> str:
    """``; 1 of 6 candidates is not compared (t0003: failed: ...)``, or nothing."""
    out = [c for c in r.candidates if c.mean is None]
    if not out:
        return ""
    return (f"; {len(out)} of {_n(len(r.candidates), 'candidate')} {'is' if len(out) == 1 else 'are'} not "
            "compared (" + ", ".join(f"{c.label}: {c.status}" for c in out[:3]) + (", ..." if len(out) > 3 else "") + ")")


def overall_verdict(scales: list[ScaleResult], direction: str) -> str:
    """The largest scale's sentence; a smaller scale that flips where it does not is named."""
    grown = scales[1:]
    if not grown:
        return "no larger scale was trained"
    last = grown[-1]
    text = scale_verdict(last, direction)
    flips = [r for r in grown[:-1] if r.pairs.flipped and not last.pairs.flipped]
    if flips:
        text += "; " + "; ".join(f"{where(r)} {_n(r.pairs.flipped, 'pair')} flipped" for r in flips)
    return text[0].upper() + text[1:] + "."




def extrapolate(scales: list[ScaleResult], target: float, direction: str, z: float = 2.0) -> Extrapolation | None:
    """Each candidate complete at every scale: ``quality = a + b ln(params)`` by least squares
    over the scales, its value at ``target`` parameters ± ``z`` standard errors (seed noise
    propagated through the fit, plus the fit's own misfit from its residuals); two candidates
    are ordered at the target only when their predictions differ by more than ``z``
    combined standard errors."""
    if len(scales) < 3:
        return None
    labels = [c.label for c in scales[0].candidates
              if all(_done(r, c.label) for r in scales)]
    preds: list[Prediction] = []
    var: dict[str, float] = {}
    for label in labels:
        cs = [next(c for c in r.candidates if c.label == label) for r in scales]
        x = np.log([c.unique_params for c in cs])
        y = np.array([c.mean for c in cs])
        se = np.array([c.se or 0.0 for c in cs])
        X = np.stack([np.ones_like(x), x], 1)
        inv = np.linalg.pinv(X.T @ X)
        coef = inv @ X.T @ y
        x0 = np.array([1.0, math.log(target)])
        weights = x0 @ inv @ X.T  # the prediction as a weighted sum of the scales' means
        resid = y - X @ coef
        misfit = float(resid @ resid) / (len(y) - 2) if len(y) > 2 else 0.0
        v = float((weights ** 2 * se ** 2).sum()) + misfit * float(x0 @ inv @ x0)
        pred = float(x0 @ coef)
        var[label] = v
        preds.append(Prediction(label=label, slope=float(coef[1]), intercept=float(coef[0]), params=target,
                                predicted=pred, lo=pred - z * math.sqrt(v), hi=pred + z * math.sqrt(v)))
    sign = -1.0 if direction == "maximize" else 1.0
    preds.sort(key=lambda p: sign * p.predicted)
    unresolved = [(a.label, b.label) for a, b in itertools.combinations(preds, 2)
                  if abs(a.predicted - b.predicted) <= z * math.sqrt(var[a.label] + var[b.label])]
    largest = max(c.unique_params for r in scales for c in r.candidates if c.unique_params)
    note = (f"EXTRAPOLATED: a straight line of quality against ln(unique parameters) through "
            f"{len(scales)} trained scales, carried to {target:.3g} parameters ({target / largest:.3g}× the largest "
            f"trained); the interval (± {z:g} s.e.) counts seed noise and the line's misfit, not a change of shape "
            "beyond the trained range (a bounded metric such as accuracy saturates; a line does not see it)")
    return Extrapolation(target=target, model="quality = a + b · ln(unique_params), least squares over the scales",
                         candidates=preds, order=[p.label for p in preds], unresolved=unresolved, note=note)


def _done(r: ScaleResult, label: str) -> bool:
    c = next((c for c in r.candidates if c.label == label), None)
    return c is not None and c.mean is not None and c.unique_params is not None and c.unique_params > 0


def extrapolation_sentence(e: Extrapolation) -> str:
    order = " > ".join(e.order) if e.order else "—"
    if not e.candidates:
        return "Extrapolation: no candidate is complete at every scale."
    if not e.unresolved:
        return f"Extrapolated to {e.target:.3g} parameters, every pair is ordered: {order}."
    return (f"Extrapolated to {e.target:.3g} parameters the predicted order is {order}, but the fit is too "
            f"uncertain to order {_n(len(e.unresolved), 'pair')}: "
            + ", ".join(f"{a} vs {b}" for a, b in e.unresolved) + ".")


__all__ = ["CandidateResult", "Extrapolation", "Measured", "PairResult", "Pairs", "Prediction", "ScaleResult",
           "Transfer", "classify", "compare_scale", "extrapolate", "extrapolation_sentence", "front_labels",
           "overall_verdict", "pairs", "rank_agreement", "reanalysed", "scale_verdict", "shown"]
