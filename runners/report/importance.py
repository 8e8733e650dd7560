"""Which sampled parameters the final quality depends on: optuna's fANOVA
(``FanovaImportanceEvaluator``, a random forest's functional ANOVA: each parameter's share
of the quality variance; needs scikit-learn) over an in-memory study rebuilt from the trial
records (``optuna.trial.create_trial``). Not optuna's default evaluator, PED-ANOVA, which
asks which parameters set membership of the top quantile of trials: on a sweep of ten
candidates that quantile is one trial.

Past :data:`MAX_TRIALS` complete trials the forest is fitted on a uniform sample of that many
(without replacement, seed 0, in completion order), and the chart says so: fitting 10,000
trials costs optuna seconds (each ``add_trial`` deep-copies). On the 10,000-candidate
benchmark (``benchmarks/bench_status_scale.py``) the sample's shares are all trials' within
0.004, in 0.8 s instead of 2.1 s.

scikit-learn imports pandas (and with it pyarrow) when it is installed, for nothing a forest
fitted on arrays uses (``sklearn.utils.fixes``'s ``try: import pandas``): where pandas is not
loaded yet, :func:`_evaluator` imports it as absent, 62 MB and 0.4 s less (the 10,000-candidate
report's peak memory, ``benchmarks/bench_status_scale.py``), and pandas imports as usual after."""
from __future__ import annotations

import math
import warnings
from typing import Any

from .data import Experiment, completion_order

MIN_TRIALS = 4
MAX_TRIALS = 2_000  # past it, a uniform sample of this many trials (sample_note says so)
UNSET = "(unset)"


def _distribution(values: list[Any]):
    """The narrowest optuna distribution that holds every sampled value of a parameter."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric and all(isinstance(v, int) for v in values):
        return IntDistribution(min(values), max(values))
    if numeric:
        return FloatDistribution(float(min(values)), float(max(values)))
    return CategoricalDistribution(sorted({_choice(v) for v in values}, key=str))


def _choice(v: Any):
    """Optuna categorical choices are None, bool, int, float or str."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _value(v: Any, dist):
    from optuna.distributions import FloatDistribution
    return float(v) if isinstance(dist, FloatDistribution) else _choice(v)


def sampled(exp: Experiment) -> tuple[list[dict[str, Any]], list[float]]:
    """Parameters and final quality of each ranked complete trial, in completion order."""
    q = exp.quality.name
    params, quality = [], []
    for t in completion_order(exp):
        if t.params and q in t.values and math.isfinite(t.values[q]):
            params.append(t.params)
            quality.append(t.values[q])
    return params, quality


def subsample(n: int) -> list[int] | None:
    """Positions (sorted: completion order kept) of the :data:`MAX_TRIALS` trials importance
    is computed on, drawn uniformly without replacement with seed 0; None: all ``n``."""
    if n <= MAX_TRIALS:
        return None
    import numpy as np
    return sorted(np.random.default_rng(0).choice(n, MAX_TRIALS, replace=False).tolist())


def sample_note(exp: Experiment) -> str:
    """The sentence the importance chart carries when it was computed on a sample, else ''."""
    n = len(sampled(exp)[0])
    if subsample(n) is None:
        return ""
    return (f"importance from {MAX_TRIALS:,} of {n:,} trials, sampled uniformly at random "
            "(without replacement, seed 0)")


def varying(params: list[dict[str, Any]]) -> list[str]:
    """Parameter names that take more than one value."""
    names = sorted({n for p in params for n in p})
    return [n for n in names if len({repr(p.get(n)) for p in params}) > 1]


def noise_floor(exp: Experiment) -> float | None:
    """The share of the variance of the candidates' mean quality that seed noise alone would
    give: the mean squared standard error over the variance of the means (None: unknown)."""
    q = exp.quality.name
    ranked = {r.trial.id: r for r in exp.rows if r.k is None or r.k == max(
        (s.k for s in exp.rows if s.trial.id == r.trial.id and s.k is not None), default=None)}
    errors = [r.se.get(q) for r in ranked.values()]
    if len(ranked) < 2 or any(e is None or not math.isfinite(e) for e in errors):
        return None
    means = [r.values[q] for r in ranked.values()]
    mu = sum(means) / len(means)
    var = sum((m - mu) ** 2 for m in means) / (len(means) - 1)
    return min(1.0, sum(e * e for e in errors) / len(errors) / var) if var > 0 else 1.0


def _evaluator():
    """optuna's fANOVA evaluator (seed 0), scikit-learn imported without pandas where pandas
    is not loaded yet (the module docstring says why)."""
    import sys
    blocked = "pandas" not in sys.modules
    if blocked:
        sys.modules["pandas"] = None  # type: ignore[assignment]  # import pandas -> ImportError
    try:
        import optuna.importance
        evaluator = optuna.importance.FanovaImportanceEvaluator  # optuna's import is lazy: done here
    finally:
        if blocked and sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]
    return evaluator(seed=0)


def param_importance(exp: Experiment) -> tuple[dict[str, float], str | None]:
    """fANOVA importance of each varying parameter for the final quality (sums to 1), or an
    empty dict and the reason it cannot be computed yet; past :data:`MAX_TRIALS` trials, on
    the sample :func:`subsample` draws (:func:`sample_note`)."""
    params, quality = sampled(exp)
    keep = subsample(len(params))
    if keep is not None:
        params, quality = [params[i] for i in keep], [quality[i] for i in keep]
    names = varying(params)
    if len(params) < MIN_TRIALS:
        return {}, f"needs {MIN_TRIALS} complete trials with sampled parameters (have {len(params)})"
    if not names:
        return {}, "no sampled parameter varies across the complete trials"
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # A conditional parameter absent from some trials (T of an unlooped candidate) gets the
    # level UNSET there: optuna's evaluators keep only trials holding every parameter asked
    # about, so without it the importance of every parameter would be computed on the
    # candidates where the condition holds alone (the quickstart's T on looped models only).
    params = [{n: p.get(n, UNSET) for n in names} for p in params]
    dists = {n: _distribution([p[n] for p in params]) for n in names}
    study = optuna.create_study(direction=exp.quality.direction)
    for p, value in zip(params, quality):
        chosen = {n: _value(p[n], dists[n]) for n in names}
        study.add_trial(optuna.trial.create_trial(
            params=chosen, distributions={n: dists[n] for n in chosen}, value=value))
    try:
        with warnings.catch_warnings():  # "fewer than 2 trials per regime": expected in small sweeps
            warnings.simplefilter("ignore", UserWarning)
            evaluator = _evaluator()  # first: it imports optuna.importance
            found = optuna.importance.get_param_importances(study, params=names, evaluator=evaluator)
            return {n: float(v) for n, v in found.items()}, None
    except (RuntimeError, ValueError) as exc:  # e.g. conditional parameters never co-sampled
        return {}, f"optuna could not compute importance: {exc}"


__all__ = ["MAX_TRIALS", "UNSET", "noise_floor", "param_importance", "sample_note", "sampled", "subsample", "varying"]
