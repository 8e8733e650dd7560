"""Search spaces: a base architecture, named parameters, and what a sweep optimises.

A space (YAML, or a Python file for define-by-run spaces) holds:

- ``base``: a shipped architecture name, a spec file (relative to the space file), or an
  inline spec mapping;
- ``params``: each a distribution and a ``target``, a dotted path into the user-level spec
  (``loop.boundary``, ``loop.T``, ``hybrid.ratio.attn``, ``model.width``,
  ``layer.mixer.kind``, ``loop.windows``, ``elastic.switch_at``) or into the proxy's
  trainer settings (``proxy.lr``). ``choices: [...]`` is categorical (any YAML values,
  lists included; ``null`` deletes the target); ``low``/``high`` is an int range when both
  are ints, else a float range, optionally ``step``-ped or ``log``. ``when: {other: [values]}``
  makes a parameter conditional on earlier ones (``T`` only when the boundary loops);
- ``constraints``: cost-model bounds checked before any training, e.g.
  ``unique_params <= 20e6`` or ``kv_bytes(seq_len=32768) <= 2e9``;
- ``match``: resize every candidate to the same unique parameters or projection compute
  (the spec's own ``match:``, applied to each candidate);
- ``objectives``: a measured proxy metric (``acc``, ``eval_loss``, ``n_max``, ...) and cost
  metrics (:data:`nas.metrics.COST_METRICS`) or serving metrics
  (:data:`nas.metrics.SERVING_METRICS`), each minimised or maximised;
- ``proxy``: the task and trainer settings of one proxy run;
- ``search``: sampler, trials, concurrency, resources per trial, early stopping;
- ``oneshot`` (instead of ``params``): search the base hybrid's placement, and the loop
  count, from one weight-sharing supernet (:class:`OneShotSpec`, :mod:`nas.oneshot`);
- ``scales``: the sizes the base (and so a front) is to be grown to, each a width multiple
  (``2``: width, head counts and FFN widths doubled, head dims and loops kept,
  :func:`nas.budget.scale_arch`) or a target ``{unique_params: 2e5}`` (grown in proportion,
  landed by the FFN width, :func:`nas.budget.scale_to_params`); at most
  :data:`MAX_SCALES`, width multiples in (0, :data:`MAX_SCALE_FACTOR`].
  :func:`resolve_scales` lists them as :class:`Scale` s without pricing anything;
  :func:`scale_base` grows the base to each (what ``loopnas validate`` prints).

A Python space file defines ``SPACE`` (the same mapping; ``params`` optional) and
``sample(trial, base)``, which calls ``trial.suggest_*`` and returns a user-level spec
(a mapping, or an ``ArchSpec``); ``base`` is a fresh copy of the base spec mapping.

Pure data and pure functions: no torch, no optuna import (a trial is anything with
Optuna's ``suggest_*`` methods, so ``optuna.trial.FixedTrial`` replays a candidate).
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from .errors import Problem, SpecError, from_validation_error, suggest
from .load import not_a_spec, parse_yaml, read_text, resolve, spec_from_dict
from .metrics import COST_METRICS, SERVING_METRICS, ObjectiveRole
from .oneshot import OneShotCheckSpec, OneShotRemedySpec
from .proxy import (
    CURRICULUM_SET, PROXY_ONLY, REFUSED_SAMPLER_PARAMS, SAMPLER_CLASSES, SAMPLER_PARAMS, TASK_METRICS, TASK_PARAMS,
    ProxySpec, budget_problem, sampler_class, task_metrics, with_budget,
)
from .spec import ArchSpec, MatchSpec, Name

SAMPLERS = tuple(SAMPLER_CLASSES)
MAX_SEQ_LEN = 1 << 40
"""The longest context a space prices (costs stay exact floats well beyond it)."""
SeqLen = Annotated[int, Field(gt=0, le=MAX_SEQ_LEN, strict=True)]
MAX_GRID = 100_000
"""The most points a grid sampler may enumerate (Optuna lists the whole product)."""
STORAGE_DRIVERS = {"sqlite": "sqlite3", "postgresql": "psycopg2", "mysql": "MySQLdb",
                   "mariadb": "MySQLdb", "oracle": "cx_Oracle", "mssql": "pyodbc"}
"""SQLAlchemy's dialects and the module of each one's default driver."""
_STORAGE = re.compile(r"^(\w+)(?:\+(\w+))?://(.*)$", re.S)
MAX_SCALES = 8
"""The most scales a space may name: each is a model to train far larger."""
MAX_SCALE_FACTOR = 64.0
"""The largest width multiple a scale may ask for (a scale's target may not need more)."""
MAX_TRIALS = 100_000
"""The most trials a sweep may ask for (as many as a grid may list)."""
MAX_CONCURRENCY = 1024
"""The most trials a sweep may run at once (each a process, or a Ray actor)."""
MAX_CPUS = 1024
"""The most CPUs one trial may ask for (its torch threads); a local sweep also checks the machine's."""
MAX_GPUS = 64
"""The most GPUs one trial may ask for."""
MIN_GPU_SHARE = 1 / 64
"""The finest share of a GPU a trial may ask for: 64 trials on one GPU."""
_CONSTRAINT = re.compile(r"^\s*(\w+)\s*(?:\(([^)]*)\))?\s*(<=|>=|<|>)\s*([-+0-9.eE_]+)\s*$")


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ParamSpec(_Data):
    """One searched parameter; see the module docstring."""

    target: str | None = Field(None, description="dotted path; default: the parameter's name")
    choices: tuple[Any, ...] | None = Field(None, min_length=1)
    low: int | float | None = None
    high: int | float | None = None
    step: int | float | None = Field(None, gt=0)
    log: bool = False
    type: Literal["int", "float"] | None = None
    when: dict[str, tuple[Any, ...]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_distribution(self) -> "ParamSpec":
        ranged = self.low is not None or self.high is not None
        if (self.choices is None) == (not ranged):
            raise ValueError("give either choices: [...] or low and high")
        if ranged and (self.low is None or self.high is None):
            raise ValueError("a range needs both low and high")
        for key in ("low", "high", "step"):
            if not math.isfinite(getattr(self, key) or 0):
                raise ValueError(f"{key} is {getattr(self, key)}; bounds and steps are finite numbers")
        if ranged and not math.isfinite(self.high - self.low):
            raise ValueError(f"high - low overflows ({self.low} .. {self.high}); give a narrower range")
        if ranged and self.low > self.high:
            raise ValueError(f"low ({self.low}) exceeds high ({self.high})")
        if self.log and ranged and self.low <= 0:
            raise ValueError("log: true needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("give step or log: true, not both")
        if self.choices is not None and (self.step or self.log or self.type):
            raise ValueError("step, log and type apply to ranges, not choices")
        return self

    @property
    def kind(self) -> str:
        """categorical, int (bounds and step written as integers) or float."""
        if self.choices is not None:
            return "categorical"
        if self.type is not None:
            return self.type
        ints = all(isinstance(x, int) for x in (self.low, self.high, self.step or 1))
        return "int" if ints else "float"


def objective_metric(name: str) -> str:
    """The metric of an objective name (:attr:`ObjectiveSpec.name`), without the context it is
    priced at and the batch it is measured at: ``kv_bytes@4096`` and ``cache_bytes/b4`` and
    ``cache_bytes@4096/b4`` name ``kv_bytes`` and ``cache_bytes``."""
    return name.split("@", 1)[0].split("/", 1)[0]


class ObjectiveSpec(_Data, ObjectiveRole):
    """``metric``: a proxy metric, one of :data:`COST_METRICS` (priced by the cost model) or
    one of :data:`SERVING_METRICS` (measured by ``runners.bench``); ``seq_len`` prices
    context-dependent metrics at another length than the space's; ``batch_size`` is the
    batch of a serving measurement."""

    metric: str
    direction: Literal["minimize", "maximize"]
    seq_len: SeqLen | None = None
    batch_size: PositiveInt | None = None

    @property
    def name(self) -> str:
        """``metric``, ``metric@seq_len``, and ``metric@seq_len/bBATCH`` for a serving
        measurement at a given batch: two objectives never share a name."""
        name = self.metric if self.seq_len is None else f"{self.metric}@{self.seq_len}"
        return name if self.batch_size is None else f"{name}/b{self.batch_size}"

    @property
    def measured(self) -> bool:
        """Measured by running something (proxy training or a serving benchmark)."""
        return self.metric not in COST_METRICS

    @property
    def serving(self) -> bool:
        return self.metric in SERVING_METRICS


class EarlyStopSpec(_Data):
    """Pareto-aware successive halving (see ``runners.sweep.stopping``): at each rung
    (optimizer step), a trial stops when at least ``min_beaten_by`` trials that cost no
    more on every cost objective already beat its quality at that rung by ``margin``
    (``auto``: by two combined standard errors of seed noise; the default with
    ``proxy.seeds`` > 1, else 0)."""

    rungs: tuple[PositiveInt, ...] = Field(min_length=1)
    margin: Annotated[float, Field(ge=0)] | Literal["auto"] | None = None
    min_beaten_by: PositiveInt = 1


class ResourcesSpec(_Data):
    """Per trial: CPUs, GPUs (``f`` ≤ 1 packs ``floor(1/f)`` trials on a GPU, ``f`` > 1
    takes ``ceil(f)`` whole GPUs: ``runners.sweep.devices``), a memory cap at a fractional
    trial's share of its GPU, and on Ray the node's ``accelerator_type`` (``H100``)."""

    cpu: float = Field(1.0, gt=0, allow_inf_nan=False)
    gpu: float = Field(0.0, ge=0, allow_inf_nan=False)
    memory_cap: bool = Field(True, description="cap a fractional trial's CUDA memory at its share")
    accelerator_type: str | None = Field(None, strict=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                         description="Ray's accelerator type of the nodes to run on (A100, H100)")


def _trackers(value: Any) -> Any:
    """``track: [mlflow, tensorboard]`` is ``{mlflow: {}, tensorboard: {}}``; ``{wandb: null}`` is ``{wandb: {}}``."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {name: {} for name in value}
    if isinstance(value, dict):
        return {k: {} if v is None else v for k, v in value.items()}
    return value


class MlflowTrackSpec(_Data):
    uri: str | None = Field(None, description="a tracking URI (default MLFLOW_TRACKING_URI, else EXP/mlflow.db)")
    experiment: str | None = Field(None, description="the MLflow experiment (default the space's name)")


class TensorboardTrackSpec(_Data):
    """Event files per replicate under EXP/tensorboard (no settings)."""


class WandbTrackSpec(_Data):
    project: str | None = Field(None, description="the W&B project (default the space's name)")
    entity: str | None = None


class TrackSpec(_Data):
    """Experiment trackers the sweep's driver logs to (``runners.track``), never its workers."""

    mlflow: MlflowTrackSpec | None = None
    tensorboard: TensorboardTrackSpec | None = None
    wandb: WandbTrackSpec | None = None


class SearchSpec(_Data):
    sampler: str = "tpe"
    sampler_params: dict[str, Any] = Field(default_factory=dict)
    trials: PositiveInt = Field(8, le=MAX_TRIALS)
    concurrency: PositiveInt = Field(2, le=MAX_CONCURRENCY)
    resources: ResourcesSpec = ResourcesSpec()
    early_stopping: EarlyStopSpec | None = None
    trial_timeout: float | None = Field(None, gt=0, allow_inf_nan=False, description="seconds per trial")
    on_oom: Literal["retry_alone", "fail"] = Field("retry_alone", description="a trial that runs out of "
                                                   "CUDA memory beside others: rerun it alone on a whole GPU, or record it oom")
    seed: int = 0
    storage: str | None = Field(None, description="an Optuna RDB URL (sqlite:///x.db, "
                                "postgresql://...) instead of the experiment's journal file")
    # where results are also logged, not what they are: left out of the space a resume compares
    track: Annotated[TrackSpec, BeforeValidator(_trackers)] = Field(TrackSpec(), exclude=True)


class OneShotSearchSpec(_Data):
    """How sub-networks of a trained supernet are chosen for evaluation: ``beam`` grows
    placements one non-majority layer at a time, keeping the ``width`` best for ``depth``
    steps (default: the ratio's number of non-majority layers); ``exhaustive`` evaluates
    every placement at the ratio's counts. Each placement is evaluated at every loop count;
    ``score_loops`` is the count that ranks them (default: the largest). ``task`` and
    ``task_params``: the evaluation task that scores them (default: the proxy's task;
    ``task_params`` alone overrides the proxy task's, e.g. a longer ``seq_len``), on the
    proxy task's vocabulary."""

    strategy: Literal["beam", "exhaustive"] = "beam"
    width: PositiveInt = 3
    depth: PositiveInt | None = None
    score_loops: PositiveInt | None = None
    task: str | None = None
    task_params: dict[str, Any] = Field(default_factory=dict)


class OneShotSpec(_Data):
    """One-shot search (PostNAS-style): every layer of the base hybrid becomes a ``switch``
    over its ratio's mixers, the loop count becomes elastic over ``loops``; one supernet is
    trained (``sampling``: ``ratio``, every sampled subnet at the base ratio's counts, or
    ``uniform``, every layer independently uniform over the mixers), then its sub-networks
    are evaluated with its weights. ``init_from``: a trainer checkpoint of a base spec
    (path relative to the space file) to start from; ``freeze_ffn``: keep its FFNs fixed
    (PostNAS's frozen MLPs). ``train``: trainer settings of the supernet run over the
    space's ``proxy`` (e.g. more steps)."""

    loops: tuple[PositiveInt, ...] | None = Field(None, min_length=1)
    sampling: Literal["ratio", "uniform"] = "ratio"
    init_from: str | None = None
    freeze_ffn: bool = False
    train: dict[str, Any] = Field(default_factory=dict)
    search: OneShotSearchSpec = OneShotSearchSpec()
    check: OneShotCheckSpec | bool = OneShotCheckSpec()  # the self-check (nas.oneshot.spot_check)
    remedy: OneShotRemedySpec = OneShotRemedySpec()  # nas.oneshot.OneShotRemedySpec


def _param_count(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a parameter count; give a finite number > 0, e.g. 2e5")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value[:40]!r} is not a parameter count; give a finite number > 0, e.g. 2e5") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{value} is not a parameter count; give a finite number > 0, e.g. 2e5")
    return number


class ScaleTarget(_Data):
    """A scale given by its size: the base grown in proportion to ``unique_params``."""

    unique_params: Annotated[float, BeforeValidator(_param_count)]


def _scale_entry(value: Any) -> Any:
    """A width multiple, a finite number in (0, MAX_SCALE_FACTOR], or a mapping (a
    :class:`ScaleTarget`); a numeric string is a number (YAML reads ``2e5`` as text)."""
    if isinstance(value, (dict, ScaleTarget)):
        return value
    fix = "write a width multiple (2 doubles the width) or a target {unique_params: 2e5}"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{value[:40]!r} is not a scale; {fix}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a scale; {fix}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{value} is not a width multiple; give a finite number > 0 (2 doubles the width)")
    if value > MAX_SCALE_FACTOR:
        raise ValueError(f"{value:g}× the width is past {MAX_SCALE_FACTOR:g}×; give at most "
                         f"{MAX_SCALE_FACTOR:g}, or a target {{unique_params: N}}")
    return float(value)


ScaleEntry = Annotated[float | ScaleTarget, BeforeValidator(_scale_entry)]


class SpaceSpec(_Data):
    name: Name = "space"
    description: str = ""
    base: str | dict[str, Any] | None = None
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    constraints: tuple[str, ...] = ()
    match: MatchSpec | None = None
    objectives: tuple[ObjectiveSpec, ...] = Field(min_length=1)
    proxy: ProxySpec
    search: SearchSpec = SearchSpec()
    oneshot: OneShotSpec | None = None
    seq_len: SeqLen = Field(1024, description="context at which cost sheets are priced")
    scales: tuple[ScaleEntry, ...] = Field((), description="sizes to grow the base to: width "
                                           "multiples (2) or targets {unique_params: 2e5}")


@dataclass(frozen=True)
class Constraint:
    metric: str
    seq_len: int | None
    op: str
    bound: float
    text: str

    def violation(self, value: float) -> float:
        """How far ``value`` is outside the bound (≤ 0: satisfied), Optuna's convention."""
        excess = value - self.bound if self.op in ("<=", "<") else self.bound - value
        return excess if excess != 0 or self.op in ("<=", ">=") else 1.0


@dataclass(frozen=True)
class Space:
    """A loaded space: its data, the base spec mapping, and a Python ``sample`` if any."""

    spec: SpaceSpec
    source: Path
    base: dict[str, Any] | None
    constraints: tuple[Constraint, ...]
    sample_fn: Callable[[Any, dict | None], Any] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def suggest(self, trial) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Sample one candidate: (user-level spec mapping, proxy overrides, params)."""
        base = copy.deepcopy(self.base) if self.base is not None else None
        if self.sample_fn is not None:
            try:
                out = self.sample_fn(trial, base)
            except BaseException as exc:  # the user's code (sys.exit too): this candidate is infeasible, with why
                if type(exc) is KeyboardInterrupt:  # Ctrl-C itself
                    raise
                raise SpecError([Problem("sample", f"raised {_one_line(exc)}")], str(self.source)) from None
            data = out.model_dump(mode="json", exclude_unset=True) if isinstance(out, ArchSpec) else out
            if not isinstance(data, dict):
                raise SpecError([Problem("sample", f"must return a spec mapping or ArchSpec, got "
                                                   f"{type(out).__name__}")], str(self.source))
            return self._with_match(data), {}, dict(getattr(trial, "params", {}))
        data, proxy, params = base or {}, {}, {}
        for name, p in self.spec.params.items():
            if not all(params.get(other, _MISSING) in allowed for other, allowed in p.when.items()):
                continue
            value = _suggest(trial, name, p)
            params[name] = value
            target = p.target or name
            if target.startswith("proxy."):
                set_path(proxy, target[len("proxy."):], value)
            else:
                set_path(data, target, value)
        return self._with_match(data), proxy, params

    def _with_match(self, data: dict) -> dict:
        if self.spec.match is not None:
            data = {**data, "match": self.spec.match.model_dump(mode="json", exclude_none=True)}
        return data

    def candidate(self, trial) -> tuple[ArchSpec, dict[str, Any], dict[str, Any]]:
        """Sample, then lower, validate and budget-match: (canonical spec, proxy overrides,
        params). Raises :class:`SpecError` for a candidate that is not a valid spec.
        A one-shot space's candidate is a sub-network of its supernet."""
        if self.spec.oneshot is not None:
            from .oneshot import candidate

            return candidate(self, trial)
        data, proxy, params = self.suggest(trial)
        arch = resolve(spec_from_dict(data, "candidate"), "candidate")
        return arch, proxy, params


_MISSING = object()


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity(space: Space) -> dict[str, str]:
    """What defines a space's candidates and their scores beyond the space's own mapping,
    hashed: the base spec it resolves to (``base``: the file's or shipped spec's mapping),
    a Python space's source (``source``: the file's bytes, so an edited ``sample()``), the
    proxy and the objectives. A sweep stores it at start; a resume compares it
    (:func:`changes`)."""
    out = {"proxy": _digest(space.spec.proxy.model_dump(mode="json")),
           "objectives": _digest([o.model_dump(mode="json") for o in space.spec.objectives])}
    if space.base is not None:
        out["base"] = _digest(space.base)
    if space.sample_fn is not None:
        try:
            out["source"] = hashlib.sha256(Path(space.source).read_bytes()).hexdigest()[:16]
        except OSError:
            pass
    return out


def changes(space: Space, old_space: dict, old_identity: dict | None) -> list[str]:
    """What differs between ``space`` and the one an experiment was started with (its
    record's ``space`` mapping and :func:`identity`, None for an experiment written before
    it was kept: then only the mapping is compared), in words; empty: the same."""
    new, old = identity(space), old_identity or {}
    base = space.spec.base if isinstance(space.spec.base, str) else None
    words = {"base": f"base spec ({base} changed since)" if base else "base spec",
             "source": f"Python space ({space.source.name} changed since)"}
    out = [words.get(key, key) for key in ("source", "base", "proxy", "objectives")
           if key in old and key in new and old[key] != new[key]]
    dump = space.spec.model_dump(mode="json")
    named = {"source", "base", "proxy", "objectives"} & {k for k in old if k in new and old[k] != new[k]}
    for key in sorted(old_space.keys() & dump.keys()):  # a field added since a release is not a change
        if old_space[key] != dump[key] and key not in named:
            out.append(key)
    return out


def _suggest(trial, name: str, p: ParamSpec) -> Any:
    if p.kind == "categorical":
        labels = [_label(c) for c in p.choices]
        label = trial.suggest_categorical(name, labels)
        return p.choices[labels.index(label)]
    if p.kind == "int":
        return trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)


def _label(choice: Any) -> Any:
    """Optuna's categorical choices must be scalars: other values travel as JSON text."""
    return choice if choice is None or isinstance(choice, (bool, int, float, str)) else json.dumps(choice)


def set_path(data: dict, path: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``path`` ``a.b.c`` (None deletes the key)."""
    *heads, last = path.split(".")
    for head in heads:
        nxt = data.get(head)
        if not isinstance(nxt, dict):
            nxt = data[head] = {}
        data = nxt
    if value is None:
        data.pop(last, None)
    else:
        data[last] = value


def spec_hash(arch: ArchSpec, proxy: dict[str, Any] | None = None) -> str:
    """A canonical spec's identity (with any per-candidate proxy settings): two candidates
    with the same hash are the same experiment."""
    payload = json.dumps([arch.model_dump(mode="json"), proxy or {}], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cost_value(arch: ArchSpec, metric: str, seq_len: int, k: int | None = None, sheets: dict | None = None) -> float:
    """A cost-model quantity of ``arch`` at ``seq_len`` (``k``: an elastic loop count);
    ``sheets`` caches the priced spec per context."""
    from .cost import cost, sheet_value

    sheets = {} if sheets is None else sheets
    if seq_len not in sheets:
        sheets[seq_len] = cost(arch, seq_len=seq_len)
    key = ("dict", seq_len)
    if key not in sheets:
        sheets[key] = sheets[seq_len].to_dict()
    return sheet_value(sheets[key], metric, k)


def violations(space: Space, arch: ArchSpec, sheets: dict | None = None) -> list[tuple[Constraint, float]]:
    """Each constraint with its violation amount (> 0: violated)."""
    return [(c, c.violation(cost_value(arch, c.metric, c.seq_len or space.spec.seq_len, sheets=sheets)))
            for c in space.constraints]


def parse_constraint(text: str, path: str) -> Constraint:
    m = _CONSTRAINT.match(text)
    if m is None:
        raise SpecError([Problem(path, f"cannot read {text!r}; write e.g. 'unique_params <= 20e6' "
                                       "or 'kv_bytes(seq_len=32768) <= 2e9'")])
    metric, args, op, bound = m.groups()
    if metric not in COST_METRICS:
        raise SpecError([Problem(path, f"unknown cost metric {metric!r}; {suggest(metric, COST_METRICS)}"
                                       f"valid: {', '.join(COST_METRICS)}")])
    seq_len = None
    for arg in filter(None, (a.strip() for a in (args or "").split(","))):
        key, _, value = arg.partition("=")
        if key.strip() != "seq_len" or not re.fullmatch(r"[0-9]{1,13}", value.strip()):
            raise SpecError([Problem(path, f"{arg!r}: the only argument is seq_len=<int>")])
        seq_len = int(value)
        if not 0 < seq_len <= MAX_SEQ_LEN:
            raise SpecError([Problem(path, f"seq_len={seq_len} is not in 1..{MAX_SEQ_LEN}")])
    try:
        number = float(bound.replace("_", ""))
    except ValueError:
        raise SpecError([Problem(path, f"{bound!r} is not a number")]) from None
    if not math.isfinite(number):
        raise SpecError([Problem(path, f"{bound!r} is not a finite number")])
    return Constraint(metric, seq_len, op, number, text.strip())


def _problems(spec: SpaceSpec, base: dict | None, python: bool) -> list[Problem]:
    out: list[Problem] = []
    if base is None and not python:
        out.append(Problem("base", "a YAML space needs a base architecture (a shipped name, a file, "
                                   "or an inline spec)"))
    if spec.oneshot is not None:
        out += _oneshot_problems(spec, base, python)
    elif not spec.params and not python:
        out.append(Problem("params", "a YAML space needs at least one parameter"))
    names = list(spec.params)
    for i, (name, p) in enumerate(spec.params.items()):
        for other in p.when:
            if other not in names[:i]:
                hint = suggest(other, names[:i])
                out.append(Problem(f"params.{name}.when.{other}", f"{hint}'when' may name only parameters "
                                   f"declared before '{name}': {', '.join(names[:i]) or 'none'}"))
        target = p.target or name
        if base is not None and not target.startswith("proxy.") and target.split(".")[0] not in ArchSpec.model_fields:
            out.append(Problem(f"params.{name}.target", f"{target!r} is not a spec field; "
                               f"{suggest(target.split('.')[0], ArchSpec.model_fields)}targets start with "
                               "a spec field (model, layer, loop, hybrid, elastic, ...) or 'proxy.'"))
        elif base is not None or target.startswith("proxy."):
            out += _target_problems(spec, name, p)
    quality = [o for o in spec.objectives if o.quality]
    if len(quality) > 1:
        out.append(Problem("objectives", "at most one proxy quality objective; the others must be "
                                         f"cost metrics ({', '.join(COST_METRICS)}) or serving "
                                         f"metrics ({', '.join(SERVING_METRICS)})"))
    for i, o in enumerate(spec.objectives):
        if o.batch_size is not None and not o.serving:
            out.append(Problem(f"objectives[{i}].batch_size", f"batch_size applies to serving metrics "
                               f"({', '.join(SERVING_METRICS)}), not {o.metric!r}; remove it"))
    names = [o.name for o in spec.objectives]
    for i, o in enumerate(spec.objectives):
        if names.index(o.name) != i:
            out.append(Problem(f"objectives[{i}]", f"{o.name!r} is already objectives[{names.index(o.name)}]; "
                               "remove the repeat or give it another seq_len / batch_size"))
    serving = [o.name for o in spec.objectives if o.serving]
    if serving and spec.search.early_stopping is not None:
        out.append(Problem("search.early_stopping", f"cannot be combined with serving objectives "
                           f"({', '.join(serving)}): they are measured after training, so a rung cannot "
                           "compare them; remove early_stopping or the serving objectives"))
    if spec.search.early_stopping is not None:
        for r in spec.search.early_stopping.rungs:
            if r % spec.proxy.eval_every:
                out.append(Problem("search.early_stopping.rungs", f"rung {r} is not a multiple of "
                                   f"proxy.eval_every ({spec.proxy.eval_every}); rungs are evaluations"))
            if spec.proxy.steps is not None and r >= spec.proxy.steps:
                out.append(Problem("search.early_stopping.rungs", f"rung {r} is not before the last step "
                                   f"(proxy.steps = {spec.proxy.steps}); a rung must leave training to stop"))
    out += _scales_problems(spec, base)
    sampler = spec.search.sampler
    if sampler_class(sampler) is None:
        out.append(Problem("search.sampler", f"unknown sampler {sampler!r}; {suggest(sampler, [*SAMPLERS, *SAMPLER_PARAMS])}"
                           f"use one of {', '.join(SAMPLERS)} or an Optuna sampler class name "
                           f"({', '.join(SAMPLER_PARAMS)})"))
    return out + _run_problems(spec)


def _field_problem(root: type[BaseModel], parts: list[str]) -> str | None:
    """Why the dotted path ``parts`` names no field below the model ``root`` (None: it
    does). Below a mapping of free keys (``hybrid.ratio.<name>``, ``model.defaults``)
    anything goes; a list or a scalar has nothing below it."""
    tp: Any = root
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the spec"
        options = _members_of(tp)
        if options is None:
            return None
        models = [m for m in options if isinstance(m, type) and issubclass(m, BaseModel)]
        free = [m for m in options if typing.get_origin(m) is dict]
        if free and not part:
            return f"{where} has an empty key; write dotted field names"
        if free:
            tp = typing.Union[tuple(typing.get_args(m)[1] for m in free)]
            continue
        if not models:
            return f"{where} is a value, not a mapping: it has no field {part!r}"
        fields = sorted({f for m in models for f in m.model_fields})
        if part not in fields:
            return (f"{part!r} is not a field of {where}; {suggest(part, fields)}"
                    f"its fields: {', '.join(fields)}")
        tp = typing.Union[tuple(m.model_fields[part].annotation for m in models if part in m.model_fields)]
    return None


def _members_of(tp: Any) -> list | None:
    """The types a value of ``tp`` may have (Annotated, Optional and unions unwrapped);
    None where anything goes."""
    if tp is Any:
        return None
    if typing.get_origin(tp) is Annotated:
        return _members_of(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        out = []
        for arg in typing.get_args(tp):
            sub = _members_of(arg)
            if sub is None:
                return None
            out += sub
        return out
    return [tp]


def _target_problems(spec: SpaceSpec, name: str, p: ParamSpec) -> list[Problem]:
    """A target that names no field; for a trainer setting (``proxy.``), also each value
    the parameter can take, checked as the trainer and the task would check it."""
    target = p.target or name
    parts = target.split(".")
    proxy = parts[0] == "proxy"
    problem = _field_problem(ProxySpec if proxy else ArchSpec, parts[1:] if proxy else parts)
    if problem is not None:
        return [Problem(f"params.{name}.target", f"{target!r}: {problem}")]
    if not proxy or len(parts) < 2 or proxy_problems(spec.proxy):
        return []  # the proxy's own problems are reported once, at proxy
    values = ([(f"choices[{i}]", c) for i, c in enumerate(p.choices)] if p.choices is not None
              else [("low", p.low), ("high", p.high)])
    for where, value in values:
        data = spec.proxy.model_dump(mode="json", exclude_unset=True)
        set_path(data, ".".join(parts[1:]), value)
        try:
            problems = proxy_problems(ProxySpec.model_validate(data))
        except ValidationError as exc:
            problems = from_validation_error(exc, ProxySpec).problems
        if problems:
            first = problems[0]
            return [Problem(f"params.{name}.{where}", f"{value!r} does not work as {target}: "
                                                      f"{first.path + ': ' if first.path else ''}{first.message}")]
    return []


def proxy_problems(proxy: ProxySpec, prefix: str = "") -> list[Problem]:
    """The proxy's task and task parameters, as ``runners.tasks.make_task`` would check
    them (:data:`nas.proxy.TASK_PARAMS`); paths under ``prefix``."""
    if proxy.task not in TASK_PARAMS:
        return [Problem(f"{prefix}task", f"unknown task {proxy.task!r}; {suggest(proxy.task, TASK_PARAMS)}"
                                         f"known tasks: {', '.join(TASK_PARAMS)}")]
    out: list[Problem] = []
    params = TASK_PARAMS[proxy.task]
    given = [("task_params", proxy.task_params)] + [(f"extrapolate[{i}]", {**proxy.task_params, **e})
                                                    for i, e in enumerate(proxy.extrapolate)]
    for where, values in given:
        if proxy.curriculum is not None:
            fixed = sorted(set(values) & set(CURRICULUM_SET))
            if fixed:
                out.append(Problem(f"{prefix}{where}", f"{', '.join(fixed)}: set by the curriculum per "
                                                       "stage; remove them"))
            values = {**values, "n": 2, "m": 2}
        try:
            params.model_validate(values)
        except ValidationError as exc:
            for e in from_validation_error(exc, params).problems:
                path = f"{where}.{e.path}" if e.path else where
                out.append(Problem(f"{prefix}{path}", f"task {proxy.task!r}: {e.message}"))
    return out


def _resources_problems(spec: SpaceSpec) -> list[Problem]:
    """CPUs and GPUs per trial within their caps (:data:`MAX_CPUS`, :data:`MAX_GPUS`, and
    shares no finer than :data:`MIN_GPU_SHARE`)."""
    out: list[Problem] = []
    cpu, gpu = spec.search.resources.cpu, spec.search.resources.gpu
    if cpu > MAX_CPUS:
        out.append(Problem("search.resources.cpu", f"{cpu:g} CPUs per trial is more than {MAX_CPUS}; give the "
                                                   f"threads one trial uses, at most {MAX_CPUS}"))
    if 0 < gpu < MIN_GPU_SHARE:
        out.append(Problem("search.resources.gpu", f"{gpu:g} of a GPU is finer than 1/64 ({MIN_GPU_SHARE:g}: "
                                                   "64 trials on one GPU); give 0 (no GPU), a share of at "
                                                   "least 1/64, or whole GPUs"))
    elif gpu > MAX_GPUS:
        out.append(Problem("search.resources.gpu", f"{gpu:g} GPUs per trial is more than {MAX_GPUS}; give at "
                                                   f"most {MAX_GPUS}"))
    return out


def local_problem(spec: SpaceSpec) -> str | None:
    """Why a sweep on this machine (the ``optuna`` engine's worker processes) cannot give
    each trial its CPUs: more than ``os.cpu_count()`` (None: it can). A Ray cluster's nodes
    may have more, so ``validate`` notes it and a local sweep refuses it."""
    cpus, cpu = os.cpu_count() or 1, spec.search.resources.cpu
    if cpu <= cpus:
        return None
    return (f"search.resources.cpu: {cpu:g} CPUs per trial is more than this machine's {cpus} (os.cpu_count()); "
            f"a local sweep cannot run it: give at most {cpus}, or run on a Ray cluster (--engine ray --address)")


def _run_problems(spec: SpaceSpec) -> list[Problem]:
    """What the sweep would find when it starts or in every trial: the proxy's task, the
    quality metric it reports, the sampler's parameters, a grid too large to list, the
    study's storage."""
    out = proxy_problems(spec.proxy, "proxy.") + _resources_problems(spec)
    problem = budget_problem(spec.proxy.steps, spec.proxy.tokens, spec.proxy.curriculum)
    if spec.oneshot is None and problem is not None:
        out.append(Problem("proxy", problem))
    task = spec.oneshot.search.task if spec.oneshot is not None and spec.oneshot.search.task else spec.proxy.task
    params = spec.oneshot.search.task_params if spec.oneshot is not None and spec.oneshot.search.task else (
        {**spec.proxy.task_params, **(spec.oneshot.search.task_params if spec.oneshot else {})})
    known = (*task_metrics(task, params), "quality", *(("n", "n_max") if spec.proxy.curriculum else ()))
    for i, o in enumerate(spec.objectives):
        if o.quality and task in TASK_METRICS and o.metric not in known:
            out.append(Problem(f"objectives[{i}].metric", f"task {task!r} reports no metric {o.metric!r}; "
                               f"{suggest(o.metric, known)}it reports {', '.join(known)}; cost metrics: "
                               f"{', '.join(COST_METRICS)}; serving metrics: {', '.join(SERVING_METRICS)}"))
    search = spec.search
    cls = sampler_class(search.sampler)
    if cls is not None:
        allowed = [n for n in SAMPLER_PARAMS[cls] if n not in REFUSED_SAMPLER_PARAMS]
        for key in search.sampler_params:
            if key not in allowed:
                why = REFUSED_SAMPLER_PARAMS.get(key) or f"{suggest(key, allowed)}{cls} takes {', '.join(allowed)}"
                out.append(Problem(f"search.sampler_params.{key}", f"not a parameter of {cls}: {why}"))
    if cls == "GridSampler" and spec.oneshot is None and "search_space" not in search.sampler_params:
        size = grid_points(spec)
        if size is not None and size > MAX_GRID:
            many = f"{size:,}" if size < 10**15 else f"about 10^{len(str(size)) - 1}"
            out.append(Problem("search.sampler", f"a grid of {many} points is more than {MAX_GRID:,} "
                               "to list; use tpe or random, or fewer choices / a larger step"))
    if search.storage is not None:
        problem = storage_problem(search.storage)
        if problem is not None:
            out.append(Problem("search.storage", problem))
    return out


def storage_problem(url: str) -> str | None:
    """Why the Optuna RDB URL ``url`` cannot be opened here (None: it looks openable). Checks
    the form, the dialect, that SQLAlchemy and the driver are installed (without importing
    them) and, for SQLite, that the database's directory exists."""
    m = _STORAGE.match(url)
    if m is None:
        return f"{url[:60]!r} is not a database URL; write e.g. sqlite:///study.db or postgresql://user@host/db"
    dialect, driver, rest = m.groups()
    if dialect not in STORAGE_DRIVERS:
        return (f"unknown database {dialect!r}; {suggest(dialect, STORAGE_DRIVERS)}"
                f"use one of {', '.join(STORAGE_DRIVERS)}")
    if importlib.util.find_spec("sqlalchemy") is None:
        return "an RDB storage needs SQLAlchemy: pip install sqlalchemy (or remove storage)"
    module = {"pysqlite": "sqlite3", "mysqldb": "MySQLdb", "mysqlconnector": "mysql.connector"}.get(
        driver, driver) or STORAGE_DRIVERS[dialect]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"the {dialect} driver {module!r} is not installed; pip install it, or use sqlite:///study.db"
    if dialect == "sqlite":
        path = rest.split("?", 1)[0]
        if path in ("", "/", "/:memory:"):
            return "an in-memory SQLite study is lost with the driver; give a file: sqlite:///study.db"
        folder = Path(path[1:]).parent
        if not folder.is_dir():
            return f"no directory {str(folder)!r} for the SQLite file; create it or give another path"
    return None


def _oneshot_problems(spec: SpaceSpec, base: dict | None, python: bool) -> list[Problem]:
    """A one-shot space searches its base hybrid: its layers and loop count are the
    parameters, so it names none of its own."""
    out: list[Problem] = []
    one = spec.oneshot
    if python:
        out.append(Problem("oneshot", "one-shot search needs a YAML space (its parameters come "
                                      "from the base hybrid); remove oneshot or write YAML"))
    if spec.params:
        out.append(Problem("params", "a one-shot space's parameters are its base hybrid's layers "
                                     "and oneshot.loops; remove params"))
    hybrid = (base or {}).get("hybrid")
    if base is not None and (not isinstance(hybrid, dict) or len(hybrid.get("ratio") or {}) < 2):
        out.append(Problem("base.hybrid", "one-shot search places a hybrid's mixers: give the base "
                                          "hybrid: {ratio: {attn: 1, gdn: 2}} (two or more names)"))
    if base is not None and not isinstance(base.get("num_layers"), int):
        out.append(Problem("base.num_layers", "one-shot search needs num_layers (with hybrid) in the base"))
    loop = (base or {}).get("loop")
    if one.loops is not None:
        if not isinstance(loop, dict) or loop.get("boundary", "none") == "none":
            out.append(Problem("oneshot.loops", "loop counts need a looped base: give the base one "
                                                "loop: {boundary: ..., T: ...}, or remove oneshot.loops"))
        if list(one.loops) != sorted(set(one.loops)):
            out.append(Problem("oneshot.loops", f"{list(one.loops)}: list distinct loop counts in "
                                                f"increasing order, e.g. {sorted(set(one.loops))}"))
    k = one.search.score_loops
    if k is not None and k not in (one.loops or ()):
        out.append(Problem("oneshot.search.score_loops", f"{k} is not one of oneshot.loops "
                                                         f"({list(one.loops or ())}); pick one of them"))
    if not any(o.quality for o in spec.objectives):
        out.append(Problem("objectives", "one-shot search ranks sub-networks by a proxy quality "
                                         "metric: add e.g. {metric: acc, direction: maximize}"))
    if any(o.serving for o in spec.objectives):
        out.append(Problem("objectives", "one-shot search evaluates with the supernet's weights; "
                                         "serving metrics need stand-alone models: remove them"))
    if spec.search.sampler.lower() == "grid":
        out.append(Problem("search.sampler", "a one-shot sweep's sub-networks are chosen by "
                                             "oneshot.search (strategy: exhaustive lists them all); "
                                             "remove sampler: grid"))
    if spec.search.early_stopping is not None:
        out.append(Problem("search.early_stopping", "a one-shot sweep's trials evaluate, they do not "
                                                    "train: remove early_stopping"))
    problem = budget_problem(one.train.get("steps"), one.train.get("tokens"), None, required=False)
    if problem is not None:
        out.append(Problem("oneshot.train", problem))
    else:
        out += _supernet_problems(spec)
    return out


def _supernet_problems(spec: SpaceSpec) -> list[Problem]:
    """``oneshot.train`` over the proxy, as ``runners.oneshot.supernet_config`` merges them."""
    train = spec.oneshot.train
    data = with_budget(spec.proxy.model_dump(mode="json", exclude_unset=True), train)
    if set(train) & set(PROXY_ONLY):
        return [Problem(f"oneshot.train.{k}", "a sweep setting, not a trainer setting: set it in proxy")
                for k in sorted(set(train) & set(PROXY_ONLY))]
    try:
        merged = ProxySpec.model_validate(data)
    except ValidationError as exc:
        return from_validation_error(exc, ProxySpec, ("oneshot", "train")).problems
    problem = budget_problem(merged.steps, merged.tokens, merged.curriculum)
    if problem is not None:
        return [Problem("oneshot.train", f"the supernet: {problem}, here or in proxy")]
    return proxy_problems(merged, "oneshot.train.") if train.keys() & {"task", "task_params"} else []


def _load_base(base: str | dict | None, folder: Path, source: str) -> dict | None:
    if base is None or isinstance(base, dict):
        return base
    path = Path(base)
    if not path.is_absolute() and (folder / path).is_file():
        path = folder / path
    if not path.is_file():
        from spaces import arch_names, arch_path

        shipped = arch_path(base)
        if shipped is None:
            raise SpecError([Problem("base", f"{base!r} is neither a file nor a shipped architecture; "
                                             f"{suggest(base, arch_names())}")], source)
        path = shipped
    data = parse_yaml(*read_text(path))
    problem = not_a_spec(data)
    if problem is not None:  # another kind of file: one line, not a line per key
        raise SpecError([Problem("base", f"{path}: {problem}")], source)
    return data


def _space_data(path: Path) -> tuple[dict, Callable | None]:
    if path.suffix != ".py":
        return parse_yaml(*read_text(path, "space")), None
    module_spec = importlib.util.spec_from_file_location(f"_loopnas_space_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:  # a user's file: report, never a traceback or an exit
        if type(exc) is KeyboardInterrupt:  # Ctrl-C itself
            raise
        raise SpecError([Problem("", f"importing the space file failed: {_one_line(exc)}")],
                        str(path)) from None
    data, fn = getattr(module, "SPACE", None), getattr(module, "sample", None)
    if not isinstance(data, dict) or not callable(fn):
        raise SpecError([Problem("", "a Python space defines SPACE (a mapping) and "
                                     "sample(trial, base) (returns a spec)")], str(path))
    return data, fn


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def load_space(path: str | Path, data: dict | None = None) -> Space:
    """Load and check a space file (.yaml or .py); raises :class:`SpecError`. ``data``: the
    YAML file's mapping, when the caller has parsed it already."""
    path = Path(path)
    if not path.is_file():
        from spaces import space_path

        shipped = space_path(str(path))
        if shipped is None:
            raise SpecError([Problem("", "no such space file or shipped space")], str(path))
        path = shipped
    data, fn = (data, None) if data is not None else _space_data(path)
    try:
        spec = SpaceSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, SpaceSpec).with_source(str(path)) from None
    base = _load_base(spec.base, path.parent, str(path))
    problems = _problems(spec, base, fn is not None)
    if spec.oneshot is not None and spec.oneshot.init_from is not None:
        init = Path(spec.oneshot.init_from)
        init = init if init.is_absolute() else path.parent / init
        if not init.is_file():
            problems.append(Problem("oneshot.init_from", f"no checkpoint at {init}; give a trainer "
                                    "checkpoint.pt of the base spec (relative to the space file)"))
    constraints = []
    for i, text in enumerate(spec.constraints):
        try:
            constraints.append(parse_constraint(text, f"constraints[{i}]"))
        except SpecError as exc:
            problems += exc.problems
    if problems:
        raise SpecError(problems, str(path))
    space = Space(spec, path, base, tuple(constraints), fn)
    if base is not None and fn is None:
        _check_base(space)
    if spec.oneshot is not None:
        from .oneshot import check_supernet

        check_supernet(space)
    return space


def _check_base(space: Space) -> None:
    """The base spec must itself be valid: a typo there would make every candidate fail."""
    try:
        resolve(spec_from_dict(copy.deepcopy(space.base), "base"), "base")
    except SpecError as exc:
        raise SpecError([Problem(f"base.{p.path}" if p.path else "base", p.message) for p in exc.problems],
                        str(space.source)) from None


@dataclass(frozen=True)
class Scale:
    """One of a space's ``scales``: ``factor`` (a width multiple) or ``unique_params`` (a
    target), the other None; ``label`` names it: ``2x``, ``0.5x``, ``2e5``."""

    label: str
    factor: float | None = None
    unique_params: float | None = None

    def apply(self, arch: ArchSpec) -> ArchSpec:
        """``arch`` (canonical or user-level) at this scale, canonical."""
        from .budget import scale_arch, scale_to_params

        if self.factor is not None:
            return scale_arch(arch, self.factor)
        return scale_to_params(arch, self.unique_params)


def _sci(x: float) -> str:
    """``2e5``, ``1.3e9``: a parameter count as a label."""
    mantissa, exponent = f"{x:.5e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def resolve_scales(space: Space | SpaceSpec) -> list[Scale]:
    """The space's ``scales`` as :class:`Scale` s, in the order written; prices nothing
    (no torch, no cost model). ``[1, 2, {unique_params: 2e5}]`` gives
    ``Scale('1x', factor=1.0)``, ``Scale('2x', factor=2.0)``, ``Scale('2e5', unique_params=2e5)``."""
    spec = space.spec if isinstance(space, Space) else space
    return [Scale(f"{s:g}x", factor=s) if isinstance(s, float) else Scale(_sci(s.unique_params),
                                                                          unique_params=s.unique_params)
            for s in spec.scales]


def _scales_problems(spec: SpaceSpec, base: dict | None) -> list[Problem]:
    """What the written scales say without pricing: how many, repeats, a base to grow."""
    out: list[Problem] = []
    if not spec.scales:
        return out
    if base is None:
        out.append(Problem("scales", "scales grow the space's base; give the space a base, or remove scales"))
    if len(spec.scales) > MAX_SCALES:
        out.append(Problem("scales", f"{len(spec.scales)} scales, at most {MAX_SCALES}: each is a model "
                                     "trained far larger; keep the ones you mean to train"))
    labels = [s.label for s in resolve_scales(spec)]
    for i, label in enumerate(labels):
        if labels.index(label) != i:
            out.append(Problem(f"scales[{i}]", f"{label} repeats scales[{labels.index(label)}]; remove it"))
    return out


def _widest_params(base: ArchSpec) -> float:
    """Unique parameters of ``base`` at :data:`MAX_SCALE_FACTOR` × its width (inf when no
    spec is valid there: the target is then checked after scaling)."""
    from .budget import scale_arch
    from .cost import unique_params

    try:
        return unique_params(scale_arch(base, MAX_SCALE_FACTOR))
    except SpecError:
        return math.inf


def scale_base(space: Space) -> list[tuple[Scale, ArchSpec]]:
    """Each of the space's scales with its base grown to it (the space's ``match`` applied
    first, as to every candidate): canonical specs the cost model prices. Raises
    :class:`SpecError` on ``scales[i]`` for a width multiple that gives no valid spec and a
    target that no width reaches, or that needs more than :data:`MAX_SCALE_FACTOR` × the
    width. Lowers and prices a spec per probe (no torch): milliseconds per scale."""
    if not space.spec.scales:
        return []
    base = resolve(spec_from_dict(space._with_match(copy.deepcopy(space.base)), "base"), "base")
    out, problems, top = [], [], None
    for i, scale in enumerate(resolve_scales(space)):
        where = f"scales[{i}]" if scale.factor is not None else f"scales[{i}].unique_params"
        if scale.unique_params is not None and top is None:
            top = _widest_params(base)
        if scale.unique_params is not None and scale.unique_params > top:
            problems.append(Problem(where, f"{scale.label} needs more than {MAX_SCALE_FACTOR:g}× the width "
                                           f"({MAX_SCALE_FACTOR:g}× gives {top:.3g}); give at most {top:.3g}"))
            continue
        try:
            arch = scale.apply(base)
        except SpecError as exc:
            problems += [Problem(where, p.message) for p in exc.problems[:1]]
            continue
        grown = arch.model.width / base.model.width
        if grown > MAX_SCALE_FACTOR:
            problems.append(Problem(where, f"{scale.label} needs the width × {grown:.3g}, past "
                                           f"{MAX_SCALE_FACTOR:g}×; give a smaller target"))
            continue
        out.append((scale, arch))
    if problems:
        raise SpecError(problems, str(space.source))
    return out


def grid_size(space: Space) -> int | None:
    """Number of points of a space whose parameters are all finite (None otherwise); a
    one-shot space's: its placements at the base ratio times its loop counts."""
    if space.spec.oneshot is not None:
        from math import comb, prod

        from .oneshot import counts, loop_choices

        c = counts(space)
        return prod(comb(sum(c[i:]), c[i]) for i in range(len(c))) * len(loop_choices(space))
    return grid_points(space.spec)


def grid_points(spec: SpaceSpec) -> int | None:
    """The product of :func:`param_points` over the parameters (None: one is continuous);
    counted, never listed."""
    total = 1
    for p in spec.params.values():
        n = param_points(p)
        if n is None:
            return None
        total *= n
    return total


def param_points(p: ParamSpec) -> int | None:
    """How many values a grid gives ``p`` (None: a float range without a step)."""
    if p.kind == "categorical":
        return len(p.choices)
    if p.kind == "int":
        return (int(p.high) - int(p.low)) // int(p.step or 1) + 1
    if p.step is None:
        return None
    n = (p.high - p.low) / p.step  # finite bounds, but a tiny step can overflow
    return int(n + 1e-9) + 1 if math.isfinite(n) else 1 << 1024


__all__ = ["COST_METRICS", "SERVING_METRICS", "objective_metric", "SAMPLERS", "ParamSpec", "ObjectiveSpec", "ProxySpec", "EarlyStopSpec",
           "SearchSpec", "OneShotSpec", "OneShotSearchSpec", "SpaceSpec", "Constraint", "Space", "load_space", "parse_constraint",
           "set_path", "spec_hash", "cost_value", "violations", "grid_size", "grid_points",
           "param_points", "proxy_problems", "storage_problem", "MAX_GRID", "MAX_SCALES",
           "MAX_SCALE_FACTOR", "ScaleTarget", "Scale", "resolve_scales", "scale_base", "identity", "changes",
           "local_problem", "MAX_TRIALS", "MAX_CONCURRENCY", "MAX_CPUS", "MAX_GPUS", "MIN_GPU_SHARE"]
