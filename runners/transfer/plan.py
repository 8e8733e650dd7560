"""What ``loopnas transfer`` trains: the chosen candidates of a finished sweep, each grown
by ``nas.budget.scale_arch``, as one ordinary experiment directory per scale.

- **Candidates** are points of the sweep's complete trials (an elastic trial gives one per
  loop count k). ``front`` (the default) takes the front and fills it with the best
  dominated points (by non-dominated rank, then quality) to at least six, so an order
  change has somewhere to come from; ``front:N`` sets that minimum, ``top:N`` takes the N
  best by quality, ``all`` every point. A trial is retrained once, whichever of its points
  were chosen, and compared at the same k.
- **A scale's space** is the sweep's space with one categorical parameter, ``candidate``,
  whose choices name each base trial and the hash of its grown spec: the planned trials
  are those choices, so the directory resumes, either engine runs it, and its records map
  back to the base trials by ``spec_hash`` alone. No constraint, budget match or early
  stopping applies (the grown models are meant to break the proxy's budget); the seeds
  are the sweep's (``search.seed + i``), so pairs are paired across scales too.
- **Rules**: the learning rate is unchanged; the steps follow ``steps_rule``: ``same``,
  ``tokens-per-param`` (× the candidates' unique-parameter growth, geometric mean) or
  ``x2`` (× 2 per doubling of width, i.e. × the factor). Both are stated in the output.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nas.errors import LoopnasError, Problem, SpecError
from nas.space import ParamSpec, Space, SpaceSpec, set_path, spec_hash

CANDIDATE = "candidate"  # the one parameter of a scale's space
MIN_CANDIDATES = 6
STEPS_RULES = ("same", "tokens-per-param", "x2")


class TransferError(LoopnasError):
    """A transfer cannot start (a usage problem): one line, exit code 2."""


@dataclass(frozen=True)
class Chosen:
    """One candidate: a point of a base trial (``k``: its loop count, None for its own)."""

    trial: str
    k: int | None = None

    @property
    def label(self) -> str:
        return self.trial if self.k is None else f"{self.trial}@k={self.k}"


def parse_candidates(text: str) -> tuple[str, int]:
    """``front`` / ``front:N`` / ``top:N`` / ``all`` as (rule, N)."""
    m = re.fullmatch(r"\s*(front|top|all)\s*(?::\s*(\d+))?\s*", text or "")
    if m is None or (m.group(1) == "top" and not m.group(2)) or (m.group(1) == "all" and m.group(2)):
        raise TransferError(f"--candidates: give front, front:N, top:N or all (got {text!r})")
    n = int(m.group(2)) if m.group(2) else MIN_CANDIDATES
    if m.group(1) == "top" and n < 2:
        raise TransferError("--candidates top:N: N must be at least 2 (an order needs two candidates)")
    return m.group(1), n


def choose(records: list, objectives: list, rule: str = "front") -> list[Chosen]:
    """The candidates to carry to larger scales (see the module docstring), best first."""
    import numpy as np

    from nas.pareto import non_dominated_sort
    from runners.results.front import all_points

    kind, n = parse_candidates(rule)
    points = [p for p in all_points(records)
              if all(math.isfinite(p.values.get(o.name, math.nan)) for o in objectives)]
    quality = next(o for o in objectives if o.quality)
    sign = -1.0 if quality.direction == "maximize" else 1.0
    best = sorted(range(len(points)), key=lambda i: sign * points[i].values[quality.name])
    if kind == "all":
        picked = best
    elif kind == "top":
        picked = best[:n]
    else:
        rank = np.empty(len(points), dtype=int)
        layers = non_dominated_sort([[p.values[o.name] for o in objectives] for p in points],
                                    [o.direction for o in objectives]) if points else []
        for r, layer in enumerate(layers):
            rank[layer] = r
        order = sorted(best, key=lambda i: rank[i])  # stable: by quality within a rank
        front = sum(rank == 0) if points else 0
        picked = order[:max(front, n)]
    return [Chosen(points[i].trial, points[i].k) for i in picked]


def parse_scales(values) -> list:
    """Width multiples (at most ``MAX_SCALE_FACTOR``) and unique-parameter targets (a
    number above it, e.g. 2e5) as ``nas.space.Scale`` s: the space's own ``scales:`` rule."""
    from pydantic import ValidationError

    from nas.space import MAX_SCALE_FACTOR, SpaceSpec, resolve_scales

    entries = [v if v <= MAX_SCALE_FACTOR else {"unique_params": v} for v in values]
    try:
        spec = SpaceSpec.model_validate({"objectives": [{"metric": "acc", "direction": "maximize"}],
                                         "proxy": {"task": "s5", "steps": 1}, "scales": entries})
    except ValidationError as exc:
        raise TransferError(f"--scales: {exc.errors()[0]['msg']}") from None
    return resolve_scales(spec)


def scale_dir(out: Path, label: str) -> Path:
    return Path(out) / f"scale-{label}"


def base_space(exp_dir: Path, record) -> Space:
    """The sweep's space as its experiment record holds it (never re-read from the space
    file: a Python space's code does not run again, and a moved base spec does not matter)."""
    from pydantic import ValidationError

    try:
        spec = SpaceSpec.model_validate(record.space)
    except ValidationError as exc:
        raise TransferError(f"{exp_dir}: its experiment record's space no longer reads as a space "
                            f"({exc.error_count()} problems; first: {exc.errors()[0]['msg']})") from None
    if spec.oneshot is not None:
        raise TransferError(f"{exp_dir}: a one-shot sweep scores sub-networks of one supernet; transfer "
                            "retrains stand-alone candidates (sweep the stand-alone space first)")
    if next((o for o in spec.objectives if o.quality), None) is None:
        raise TransferError(f"{exp_dir}: transfer needs a measured quality objective (acc, eval_loss, ...)")
    source = next((p for p in sorted(Path(exp_dir).glob("space.*")) if p.suffix in (".yaml", ".yml", ".py")), None)
    if source is None:
        raise TransferError(f"{exp_dir}: no space file (space.yaml) in the experiment directory")
    return Space(spec, source, None, ())


def proxy_overrides(spec: SpaceSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The per-candidate trainer settings a base trial's parameters set (``proxy.lr`` ...)."""
    proxy: dict[str, Any] = {}
    for name, value in params.items():
        target = spec.params[name].target or name if name in spec.params else ""
        if target.startswith("proxy."):
            set_path(proxy, target[len("proxy."):], value)
    return proxy


@dataclass(frozen=True)
class Grown:
    """One base trial at a scale: its grown spec, or why it has none."""

    trial: str
    arch: Any  # ArchSpec | None
    proxy: dict[str, Any]
    params: dict[str, Any]
    error: str | None = None

    @property
    def choice(self) -> dict[str, Any]:
        """Its value of the ``candidate`` parameter: the base trial and its grown spec's hash."""
        return {"trial": self.trial, "spec_hash": spec_hash(self.arch, self.proxy) if self.arch else None}


def grow(records: dict, trials: list[str], spec: SpaceSpec, scale) -> list[Grown]:
    """Each base trial's canonical spec grown to ``scale`` (a ``nas.space.Scale``: a width
    multiple through ``scale_arch``, a target through ``scale_to_params``)."""
    from nas.spec import stored_spec

    out = []
    for tid in trials:
        r = records[tid]
        proxy = proxy_overrides(spec, r.params)
        try:
            arch = scale.apply(stored_spec(r.arch))
        except (SpecError, ValueError) as exc:
            out.append(Grown(tid, None, proxy, r.params, f"cannot grow {tid} to {scale.label}: {exc}"))
            continue
        out.append(Grown(tid, arch, proxy, r.params))
    return out


def growth(base: list[float], grown: list[float]) -> float:
    """The geometric mean of ``grown / base`` over the candidates that have both."""
    pairs = [(g, b) for g, b in zip(grown, base) if b > 0 and g > 0]
    return math.exp(sum(math.log(g / b) for g, b in pairs) / len(pairs)) if pairs else 1.0


def steps_multiple(rule: str, width: float, params: float) -> float:
    """The multiple of the proxy's steps under ``rule`` at ``width`` × the width and
    ``params`` × the unique parameters (each a geometric mean over the candidates)."""
    if rule == "same" or width == 1:
        return 1.0
    return float(width) if rule == "x2" else float(params)


@dataclass(frozen=True)
class PlannedSpace(Space):
    """A space whose candidates are fixed, already-grown specs: a trial's ``candidate``
    parameter names one (``Space.candidate`` is the one place a trial becomes a spec)."""

    plan: tuple[Grown, ...] = ()

    def candidate(self, trial):
        labels = [json.dumps(g.choice, sort_keys=True) for g in self.plan]
        g = self.plan[labels.index(trial.suggest_categorical(CANDIDATE, labels))]
        if g.arch is None:
            raise SpecError([Problem("candidate", g.error or "no grown spec")], str(self.source))
        return g.arch, dict(g.proxy), dict(g.params)

    def planned(self) -> list[dict[str, str]]:
        """The trials to train, as Optuna parameter labels (``run_sweep(planned=...)``)."""
        return [{CANDIDATE: json.dumps(g.choice, sort_keys=True)} for g in self.plan]


def scale_space(base: Space, plan: list[Grown], label: str, multiple: float) -> PlannedSpace:
    """The space that trains ``plan`` (grown to scale ``label``) at ``multiple`` × the steps."""
    from runners.calibrate import scaled

    spec = base.spec
    search = spec.search.model_copy(update={"trials": len(plan), "storage": None})
    spec = spec.model_copy(update={
        "name": f"{spec.name}-{label}", "base": None, "match": None, "constraints": (), "scales": (),
        "description": f"loopnas transfer: {len(plan)} candidates of {spec.name} grown to {label}",
        "params": {CANDIDATE: ParamSpec(choices=tuple(g.choice for g in plan))}, "search": search})
    spec = scaled(replace(base, spec=spec), multiple).spec
    return PlannedSpace(SpaceSpec.model_validate(spec.model_dump()), base.source, None, (), None, tuple(plan))


def check_resumable(space: PlannedSpace, out: Path) -> bool:
    """Whether ``out`` already holds this scale (resume it); a different plan there is one
    clear error rather than the sweep's generic 'the space differs'."""
    from runners.results.records import EXPERIMENT, read_experiment

    if not (out / EXPERIMENT).is_file():
        return False
    old = read_experiment(out)
    if old.space != space.spec.model_dump(mode="json"):
        raise TransferError(f"{out} holds a transfer with other candidates, steps or grown specs; rerun with "
                            f"the options it was started with, or give another --out")
    return True


__all__ = ["CANDIDATE", "Chosen", "Grown", "MIN_CANDIDATES", "PlannedSpace", "STEPS_RULES", "TransferError",
           "base_space", "check_resumable", "choose", "grow", "growth", "parse_candidates", "parse_scales",
           "scale_dir", "scale_space", "steps_multiple"]
