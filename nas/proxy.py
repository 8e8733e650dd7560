"""A proxy run, typed without torch, so ``loopnas validate`` names what ``sweep`` would
otherwise find in every trial.

- :class:`TrainConfig`: everything a proxy run needs besides the architecture, the one
  definition the trainer (``runners.train``) reads; :class:`ProxySpec`, a space's
  ``proxy:``, is the same plus the sweep's own ``seeds``;
- :data:`TASK_PARAMS`: each proxy task's parameters (the constructors in
  ``runners.tasks``), and the one definition of each task's rules (``check_*``: the model
  here and the task's constructor both call it); :data:`TASK_METRICS`, the eval metrics
  each task reports; :data:`CURRICULUM_STAGES` and :func:`check_curriculum`, the curriculum's;
- :func:`budget_problem`: a run's length, ``steps`` or ``tokens``;
- :data:`SAMPLER_PARAMS`: the keyword parameters of each Optuna sampler (Optuna 5.0's
  ``__init__`` signatures), for ``search.sampler_params``.

``tests/hostile/test_hostile_input.py`` keeps the tables of other code's signatures (the
tasks' defaults, Optuna's samplers) equal to it.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

CURRICULUM_STAGES = (8, 16, 32, 64, 128, 256)
"""LT2's curriculum: the stages ``n = m`` of the state-tracking task."""
CURRICULUM_METRICS = ("last_acc", "acc", "seq_acc")
"""The eval metrics a curriculum may promote on (``last_acc`` needs tracking to the end)."""
BUDGET = ("steps", "tokens")
"""The two ways to give a run's length: one of them (:func:`budget_problem`)."""
PROXY_ONLY = ("seeds",)
"""Proxy fields the sweep reads itself; the trainer never sees them."""
MAX_SEEDS = 64
"""The most seed replicates per candidate: each is a whole training run (and its record)."""
MAX_STEPS = 10**8
"""The most optimizer steps of one proxy run (a proxy that long is a pre-training run)."""
MAX_TOKENS = 10**15
"""The largest token budget of one proxy run."""


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CurriculumConfig(_Data):
    """LT2's curriculum: stages ``n = m``; each stage gets ``stage_steps`` optimizer steps
    (and its own warmup + cosine schedule) to reach ``threshold`` eval accuracy."""

    stages: tuple[PositiveInt, ...] = CURRICULUM_STAGES
    threshold: float = Field(0.90, gt=0, le=1)
    stage_steps: PositiveInt = 500
    metric: Literal[CURRICULUM_METRICS] = Field("last_acc", description="the eval metric "
                                                "promoted on: last_acc needs tracking "
                                                "to the end (runners.tasks.Curriculum)")

    @model_validator(mode="after")
    def _check(self) -> "CurriculumConfig":
        check_curriculum(self.stages, self.threshold, self.metric)
        return self


def budget_problem(steps: int | None, tokens: int | None, curriculum: Any,
                   required: bool = True) -> str | None:
    """What is wrong with a run's length (None: nothing): it is ``steps`` or ``tokens``, not
    both, and (``required``) one of them unless a curriculum's stage budgets cap the run."""
    if steps is not None and tokens is not None:
        return "set steps or tokens, not both"
    if required and steps is None and tokens is None and curriculum is None:
        return "set steps or tokens (or a curriculum, whose stage budgets cap the run)"
    return None


def with_budget(settings: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``settings`` updated by ``override``, where a length in ``override`` (``steps`` or
    ``tokens``) replaces the one in ``settings`` rather than joining it."""
    if override.keys() & set(BUDGET):
        settings = {k: v for k, v in settings.items() if k not in BUDGET}
    return {**settings, **override}


class TrainConfig(_Data):
    """Everything a proxy run needs besides the architecture."""

    task: str = "mqar"
    task_params: dict[str, Any] = Field(default_factory=dict)
    steps: PositiveInt | None = Field(None, le=MAX_STEPS, description="optimizer steps; with a "
                                      "curriculum, a cap on the whole run (default: every stage's budget)")
    tokens: PositiveInt | None = Field(None, le=MAX_TOKENS, description="token budget: steps = "
                                       "ceil(tokens / tokens per step)")
    batch_size: PositiveInt = 32
    grad_accum: PositiveInt = 1
    lr: float = Field(3e-3, gt=0, allow_inf_nan=False)
    min_lr: float = Field(3e-4, ge=0, allow_inf_nan=False)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.1, ge=0, allow_inf_nan=False)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, gt=0, allow_inf_nan=False)
    eval_every: PositiveInt = 50
    eval_batches: PositiveInt = 4
    seed: int = 0
    eval_seed: int | None = Field(None, description="seed of the fixed eval batches (None: the run's "
                                  "seed); a sweep gives every replicate and every candidate the same "
                                  "one, so their scores are compared on the same examples")
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = Field("bfloat16", description="autocast dtype, CUDA only")
    compile: bool = Field(False, description="torch.compile, CUDA only (on CPU a compile costs more "
                          "than it saves within a trial: benchmarks/results/bench_compile.md)")
    backend: Literal["auto", "torch", "fla"] = "auto"
    checkpoint_every: PositiveInt | None = None
    curriculum: CurriculumConfig | None = None
    extrapolate: tuple[dict[str, Any], ...] = Field((), description="task-parameter overrides "
                                                    "(e.g. {'n': 64} or {'seq_len': 256}), each "
                                                    "evaluated once at the end: length extrapolation")
    init_from: str | None = Field(None, description="a checkpoint (a trainer's checkpoint.pt, a "
                                  "supernet's, an extracted sub-network's) whose corresponding "
                                  "weights start the run (runners.weights.inherit)")
    freeze_ffn: bool = Field(False, description="keep every FFN and its norm at its initial "
                             "(inherited) weights: PostNAS's frozen MLPs")
    progress: bool = True

    @model_validator(mode="after")
    def _budget(self) -> "TrainConfig":
        problem = budget_problem(self.steps, self.tokens, self.curriculum)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.curriculum is not None and self.task != "state_tracking":
            raise ValueError(f"a curriculum needs task 'state_tracking' (got {self.task!r})")
        if self.curriculum is not None and self.tokens is not None:
            raise ValueError("a curriculum's sequence length changes per stage; give steps, not tokens")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) exceeds lr ({self.lr})")
        return self


class ProxySpec(TrainConfig):
    """A space's ``proxy:``: the trainer's settings and ``seeds``, the replicates per
    candidate. ``steps`` or ``tokens`` may come from a one-shot space's ``oneshot.train``
    instead, so the length is checked where the space is read (:func:`budget_problem`)."""

    seeds: PositiveInt = Field(1, le=MAX_SEEDS)

    @model_validator(mode="after")
    def _budget(self) -> "ProxySpec":
        problem = budget_problem(self.steps, self.tokens, self.curriculum, required=False)
        if problem is not None:
            raise ValueError(problem)
        return self

    def trainer(self) -> dict[str, Any]:
        """The settings as ``TrainConfig`` reads them (without :data:`PROXY_ONLY`)."""
        return self.model_dump(mode="json", exclude_none=True, exclude=set(PROXY_ONLY))


# Task parameters: strict ints (the task dataclasses do not convert "8" or 8.0), numbers
# that are not booleans. Each task's rules are one ``check_*`` function below, which the
# model here (for ``loopnas validate``) and the task's constructor (``runners.tasks``) both call.
Int = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(allow_inf_nan=False)]
Settings = tuple[tuple[int, int, int], ...]
# zoology/experiments/mqar_example_configs/original_mqar_configs.py (vocab 8192)
ZOOLOGY_TRAIN: Settings = ((64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000),
                           (256, 32, 20_000), (256, 64, 20_000))
ZOOLOGY_TEST: Settings = ((64, 4, 1_000), (64, 8, 1_000), (64, 16, 1_000), (128, 32, 1_000),
                          (256, 64, 1_000), (512, 128, 1_000), (1024, 256, 1_000))
SAMPLE_BY = ("line", "paragraph", "document")
"""How the LM task splits a text file into samples."""


class _Params(_Data):
    pass


def check_mqar(vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float, zoology: bool,
               train_settings: Any, test_settings: Any) -> tuple[Settings | None, Settings | None]:
    """The MQAR task's parameter rules; returns ``(train_settings, test_settings)`` as
    ``(seq_len, num_kv_pairs, num_examples)`` triples (``"zoology"``: the paper's)."""
    keys = vocab_size // 2 - int(zoology)

    def setting(length: int, k: int, field: str) -> None:
        if not 1 <= k <= keys:
            raise ValueError(f"{field}: need 1 <= num_kv_pairs <= {keys} (the key half of "
                             f"vocab_size={vocab_size}), got {k}")
        if length < 4 * k:
            raise ValueError(f"{field}: seq_len must be >= 4 * num_kv_pairs = {4 * k}, got {length}")

    out = []
    for field, value, preset in (("train_settings", train_settings, ZOOLOGY_TRAIN),
                                 ("test_settings", test_settings, ZOOLOGY_TEST)):
        if isinstance(value, str):
            if value != "zoology":
                raise ValueError(f"{field} must be 'zoology' or (seq_len, num_kv_pairs, "
                                 f"num_examples) triples, got {value!r}")
            value = preset
        if value is not None:
            value = tuple(tuple(int(x) for x in s) for s in value)
            if not value or any(len(s) != 3 or s[2] < 1 for s in value):
                raise ValueError(f"{field} must be non-empty (seq_len, num_kv_pairs, "
                                 f"num_examples) triples with num_examples >= 1, got {value}")
            for length, k, _ in value:
                setting(length, k, field)
        out.append(value)
    train, test = out
    if (train is None) != (test is None):
        raise ValueError("give train_settings and test_settings together (or neither)")
    setting(seq_len, num_kv_pairs, "seq_len/num_kv_pairs")
    if train and seq_len < max(s[0] for s in train):
        raise ValueError(f"seq_len ({seq_len}) must hold the longest train setting "
                         f"({max(s[0] for s in train)})")
    if power_a <= 0:
        raise ValueError(f"power_a must be > 0, got {power_a}")
    return train, test


class MQARParams(_Params):
    vocab_size: Int = 8192
    seq_len: Int = 256
    num_kv_pairs: Int = 16
    power_a: Number = 0.01
    zoology: bool = True
    train_settings: Any = None
    test_settings: Any = None
    data_seed: Int = 0

    @model_validator(mode="after")
    def _check(self) -> "MQARParams":
        try:
            check_mqar(self.vocab_size, self.seq_len, self.num_kv_pairs, self.power_a, self.zoology,
                       self.train_settings, self.test_settings)
        except TypeError as exc:  # a setting that is not a sequence of numbers
            raise ValueError(f"train_settings / test_settings: {exc}") from None
        return self


class StateTrackingParams(_Params):
    n: Int = 8
    m: Int = 8
    max_m: Int = 256
    supervise_pointer: bool = True

    @model_validator(mode="after")
    def _check(self) -> "StateTrackingParams":
        check_state_tracking(self.n, self.m, self.max_m)
        return self


def check_state_tracking(n: int, m: int, max_m: int) -> None:
    """The state-tracking task's parameter rules."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 2 <= m <= max_m:
        raise ValueError(f"m must be in 2..max_m={max_m}, got m={m}")
    if m % 2:
        raise ValueError(f"m must be even (the bit table is balanced), got m={m}")


def check_curriculum(stages: tuple[int, ...], threshold: float, metric: str) -> None:
    """The state-tracking curriculum's rules (``runners.tasks.Curriculum``)."""
    if not stages or any(b <= a for a, b in zip(stages, stages[1:])):
        raise ValueError(f"stages must be non-empty and increasing, got {stages}")
    if stages[0] < 2 or any(n % 2 for n in stages):
        raise ValueError(f"stages must be even and >= 2, got {stages}")
    if metric not in CURRICULUM_METRICS:
        raise ValueError(f"metric must be one of {', '.join(map(repr, CURRICULUM_METRICS))}, got {metric!r}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")


def check_s5(seq_len: int, degree: int) -> None:
    """The permutation word problem's parameter rules."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if not 2 <= degree <= 6:
        raise ValueError(f"degree must be in 2..6, got {degree}")


class S5Params(_Params):
    seq_len: Int = 64
    degree: Int = 5

    @model_validator(mode="after")
    def _check(self) -> "S5Params":
        check_s5(self.seq_len, self.degree)
        return self


def check_lm(data_files: Any, dataset: str | None, seq_len: int, eval_fraction: float, sample_by: str,
             streaming: bool, max_tokens: int | None) -> None:
    """The LM task's parameter rules (the corpus itself is read, and refused, later)."""
    if (data_files is None) == (dataset is None):
        raise ValueError("give exactly one of data_files and dataset")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"sample_by must be one of {SAMPLE_BY}, got {sample_by!r}")
    if streaming and max_tokens is None:
        raise ValueError("streaming needs max_tokens (the stream is read up to it)")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")


class LMParams(_Params):
    data_files: str | tuple[str, ...] | None = None
    dataset: str | None = None
    dataset_config: str | None = None
    dataset_split: str = "train"
    data_format: str | None = None
    text_field: str = "text"
    sample_by: Literal[SAMPLE_BY] = "document"
    tokenizer: str = "byte"
    seq_len: Int = 256
    eval_fraction: Number = 0.05
    max_tokens: Int | None = None
    streaming: bool = False
    cache_dir: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "LMParams":
        check_lm(self.data_files, self.dataset, self.seq_len, self.eval_fraction, self.sample_by,
                 self.streaming, self.max_tokens)
        return self


def hop_counts(k: Any, max_k: int) -> tuple[int, ...]:
    """The hop counts a hop/pointer task draws from: ``k`` as a sorted tuple (``"mixed"``:
    1..max_k)."""
    if k == "mixed":
        return tuple(range(1, max_k + 1))
    if isinstance(k, str):
        raise ValueError(f"k must be an int, a list of ints or 'mixed', got {k!r}")
    ks = (int(k),) if isinstance(k, int) else tuple(sorted({int(v) for v in k}))
    if not ks or not all(1 <= v <= max_k for v in ks):
        raise ValueError(f"k must be in 1..max_k={max_k}, got {k!r}")
    return ks


class HopInductionParams(_Params):
    n: Int = 32
    k: Int | tuple[Int, ...] | str = 3
    alphabet_size: Int = 4
    max_k: Int = 4

    @model_validator(mode="after")
    def _check(self) -> "HopInductionParams":
        check_hop_induction(self.n, self.k, self.alphabet_size, self.max_k)
        return self


def check_hop_induction(n: int, k: Any, alphabet_size: int, max_k: int) -> None:
    """The hop-induction task's parameter rules."""
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    if alphabet_size < 3:
        raise ValueError(f"alphabet_size must be >= 3 (with 2 letters the string alternates), "
                         f"got {alphabet_size}")
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    hop_counts(k, max_k)


def check_pointer_chase(num_nodes: int, num_queries: int | None, k: Any, max_k: int) -> None:
    """The pointer-chasing task's parameter rules (``num_queries=None``: every node)."""
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    if num_nodes <= max_k:
        raise ValueError(f"num_nodes must exceed max_k={max_k} (else σ^k(q) can be q), got {num_nodes}")
    if num_queries is not None and not 1 <= num_queries <= num_nodes:
        raise ValueError(f"num_queries must be in 1..num_nodes={num_nodes} (queries are distinct), "
                         f"got {num_queries}")
    hop_counts(k, max_k)


class PointerChaseParams(_Params):
    num_nodes: Int = 8
    num_queries: Int | None = None  # None: every node, once
    k: Int | tuple[Int, ...] | str = 3
    max_k: Int = 4

    @model_validator(mode="after")
    def _check(self) -> "PointerChaseParams":
        check_pointer_chase(self.num_nodes, self.num_queries, self.k, self.max_k)
        return self


TASK_PARAMS: dict[str, type[_Params]] = {
    "mqar": MQARParams, "state_tracking": StateTrackingParams, "s5": S5Params, "lm": LMParams,
    "hop_induction": HopInductionParams, "pointer_chase": PointerChaseParams,
}
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "mqar": ("eval_loss", "acc", "seq_acc"),
    "state_tracking": ("eval_loss", "acc", "seq_acc", "last_acc", "ptr_acc"),
    "s5": ("eval_loss", "acc", "seq_acc"),
    "lm": ("eval_loss", "loss", "ppl"),
    "hop_induction": ("eval_loss", "acc", "seq_acc"),
    "pointer_chase": ("eval_loss", "acc", "seq_acc"),
}
"""What each task's evaluation reports (``eval_loss`` and ``Task.metrics``); every run also
answers ``quality``, its own quality metric, and a curriculum run ``n`` and ``n_max``;
:func:`task_metrics` adds the per-hop-count ones."""


def task_metrics(task: str, params: dict[str, Any]) -> tuple[str, ...]:
    """The metrics ``task`` with ``params`` reports: :data:`TASK_METRICS`, and ``acc_k<k>``
    for each hop count of a task that draws several."""
    out = TASK_METRICS.get(task, ())
    if "k" in TASK_PARAMS.get(task, _Params).model_fields:
        try:
            p = TASK_PARAMS[task].model_validate(params)
        except ValueError:
            return out
        ks = hop_counts(p.k, p.max_k)
        out += tuple(f"acc_k{k}" for k in ks) if len(ks) > 1 else ()
    return out


CURRICULUM_SET = ("n", "m", "max_m")
"""State-tracking parameters a curriculum sets per stage."""

SAMPLER_CLASSES = {"tpe": "TPESampler", "nsga2": "NSGAIISampler", "random": "RandomSampler",
                   "grid": "GridSampler", "qmc": "QMCSampler", "gp": "GPSampler",
                   "cmaes": "CmaEsSampler", "bruteforce": "BruteForceSampler"}
SAMPLER_PARAMS: dict[str, tuple[str, ...]] = {
    "TPESampler": ("consider_prior", "prior_weight", "consider_magic_clip", "consider_endpoints",
                   "n_startup_trials", "n_ei_candidates", "gamma", "weights", "seed", "multivariate",
                   "group", "warn_independent_sampling", "constant_liar", "constraints_func"),
    "NSGAIISampler": ("population_size", "mutation", "mutation_prob", "crossover", "crossover_prob",
                      "swapping_prob", "seed", "constraints_func", "elite_population_selection_strategy",
                      "child_generation_strategy", "after_trial_strategy"),
    "NSGAIIISampler": ("population_size", "mutation", "mutation_prob", "crossover", "crossover_prob",
                       "swapping_prob", "seed", "constraints_func", "reference_points",
                       "dividing_parameter", "elite_population_selection_strategy",
                       "child_generation_strategy", "after_trial_strategy"),
    "RandomSampler": ("seed",),
    "GridSampler": ("search_space", "seed"),
    "QMCSampler": ("qmc_type", "scramble", "seed", "independent_sampler", "warn_asynchronous_seeding",
                   "warn_independent_sampling"),
    "GPSampler": ("seed", "independent_sampler", "n_startup_trials", "deterministic_objective",
                  "constraints_func", "warn_independent_sampling"),
    "CmaEsSampler": ("x0", "sigma0", "n_startup_trials", "independent_sampler",
                     "warn_independent_sampling", "seed", "consider_pruned_trials", "restart_strategy",
                     "popsize", "inc_popsize", "use_separable_cma", "with_margin", "lr_adapt",
                     "source_trials"),
    "BruteForceSampler": ("seed", "avoid_premature_stop"),
}
"""Optuna 5.0's sampler keyword parameters (``inspect.signature(cls.__init__)``), by class."""
REFUSED_SAMPLER_PARAMS = {
    "constraints_func": "Optuna 5 deprecates it; give bounds under the space's constraints, which the "
                        "sweep records on each trial (Trial.set_constraint), where the sampler reads them",
}
"""Sampler parameters a space may not give, and why."""


def sampler_class(sampler: str) -> str | None:
    """The Optuna class a ``search.sampler`` names (None: none)."""
    name = SAMPLER_CLASSES.get(sampler.lower(), sampler)
    return name if name in SAMPLER_PARAMS else None


__all__ = ["BUDGET", "CURRICULUM_METRICS", "CURRICULUM_SET", "CURRICULUM_STAGES", "MAX_SEEDS", "MAX_STEPS",
           "MAX_TOKENS", "PROXY_ONLY", "REFUSED_SAMPLER_PARAMS", "SAMPLER_CLASSES", "SAMPLER_PARAMS", "SAMPLE_BY",
           "TASK_METRICS", "TASK_PARAMS", "ZOOLOGY_TEST", "ZOOLOGY_TRAIN", "CurriculumConfig", "ProxySpec",
           "TrainConfig", "budget_problem", "check_curriculum", "check_hop_induction", "check_lm", "check_mqar",
           "check_pointer_chase", "check_s5", "check_state_tracking", "hop_counts", "sampler_class",
           "task_metrics", "with_budget"]
