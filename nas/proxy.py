"""A proxy run, typed without torch, so ``loopnas validate`` names what ``sweep`` would
otherwise find in every trial.

- :class:`TrainConfig`: everything a proxy run needs besides the architecture, the one
  definition the trainer (``runners.train``) reads; :class:`ProxySpec`, a space's
  ``proxy:``, is the same plus the sweep's own ``seeds``;
- :data:`TASK_PARAMS`: each proxy task's parameters (the constructors in
  ``runners.tasks``) with their simple range rules, and :data:`TASK_METRICS`, the eval
  metrics each task reports;
- :data:`SAMPLER_PARAMS`: the keyword parameters of each Optuna sampler (Optuna 5.0's
  ``__init__`` signatures), for ``search.sampler_params``.

``tests/hostile/test_hostile_input.py`` keeps each table equal to the code it mirrors.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

CURRICULUM_STAGES = (8, 16, 32, 64, 128, 256)
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
    metric: Literal["last_acc", "acc", "seq_acc"] = Field("last_acc", description="the eval metric "
                                                          "promoted on: last_acc needs tracking "
                                                          "to the end (runners.tasks.Curriculum)")


CurriculumSpec = CurriculumConfig


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
        if self.curriculum is None and self.steps is None and self.tokens is None:
            raise ValueError("set steps or tokens (or a curriculum, whose stage budgets cap the run)")
        return self

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.steps is not None and self.tokens is not None:
            raise ValueError("set steps or tokens, not both")
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
    instead, so a missing budget is checked where the space is read."""

    seeds: PositiveInt = Field(1, le=MAX_SEEDS)

    @model_validator(mode="after")
    def _budget(self) -> "ProxySpec":
        return self

    def trainer(self) -> dict[str, Any]:
        """The settings as ``TrainConfig`` reads them (without :data:`PROXY_ONLY`)."""
        return self.model_dump(mode="json", exclude_none=True, exclude=set(PROXY_ONLY))


# Task parameters: strict ints (the task dataclasses do not convert "8" or 8.0), numbers
# that are not booleans; each model's checks are its task's ``__post_init__`` checks.
Int = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class _Params(_Data):
    pass


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
        keys = self.vocab_size // 2 - int(self.zoology)
        if not 1 <= self.num_kv_pairs <= keys:
            raise ValueError(f"need 1 <= num_kv_pairs <= {keys} (the key half of vocab_size="
                             f"{self.vocab_size}), got {self.num_kv_pairs}")
        if self.seq_len < 4 * self.num_kv_pairs:
            raise ValueError(f"seq_len must be >= 4 * num_kv_pairs = {4 * self.num_kv_pairs}, "
                             f"got {self.seq_len}")
        if self.power_a <= 0:
            raise ValueError(f"power_a must be > 0, got {self.power_a}")
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
    """The state-tracking task's parameter rules (the task itself checks with this too)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 2 <= m <= max_m:
        raise ValueError(f"m must be in 2..max_m={max_m}, got m={m}")
    if m % 2:
        raise ValueError(f"m must be even (the bit table is balanced), got m={m}")


class S5Params(_Params):
    seq_len: Int = 64
    degree: Int = 5

    @model_validator(mode="after")
    def _check(self) -> "S5Params":
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if not 2 <= self.degree <= 6:
            raise ValueError(f"degree must be in 2..6, got {self.degree}")
        return self


class LMParams(_Params):
    data_files: str | tuple[str, ...] | None = None
    dataset: str | None = None
    dataset_config: str | None = None
    dataset_split: str = "train"
    data_format: str | None = None
    text_field: str = "text"
    sample_by: Literal["line", "paragraph", "document"] = "document"
    tokenizer: str = "byte"
    seq_len: Int = 256
    eval_fraction: Number = 0.05
    max_tokens: Int | None = None
    streaming: bool = False
    cache_dir: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "LMParams":
        if (self.data_files is None) == (self.dataset is None):
            raise ValueError("give exactly one of data_files and dataset")
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.streaming and self.max_tokens is None:
            raise ValueError("streaming needs max_tokens (the stream is read up to it)")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
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
    """The hop-induction task's parameter rules (the task itself checks with this too)."""
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    if alphabet_size < 3:
        raise ValueError(f"alphabet_size must be >= 3 (with 2 letters the string alternates), "
                         f"got {alphabet_size}")
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    hop_counts(k, max_k)


class PointerChaseParams(_Params):
    num_nodes: Int = 8
    num_queries: Int | None = None  # None: every node, once
    k: Int | tuple[Int, ...] | str = 3
    max_k: Int = 4

    @model_validator(mode="after")
    def _check(self) -> "PointerChaseParams":
        if self.max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {self.max_k}")
        if self.num_nodes <= self.max_k:
            raise ValueError(f"num_nodes must exceed max_k={self.max_k}, got {self.num_nodes}")
        if self.num_queries is not None and not 1 <= self.num_queries <= self.num_nodes:
            raise ValueError(f"num_queries must be in 1..num_nodes={self.num_nodes}, got {self.num_queries}")
        hop_counts(self.k, self.max_k)
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
SET_BY_SWEEP = ("constraints_func",)
"""Sampler parameters the sweep passes itself (from the space's ``constraints``)."""


def sampler_class(sampler: str) -> str | None:
    """The Optuna class a ``search.sampler`` names (None: none)."""
    name = SAMPLER_CLASSES.get(sampler.lower(), sampler)
    return name if name in SAMPLER_PARAMS else None


__all__ = ["CURRICULUM_STAGES", "PROXY_ONLY", "MAX_SEEDS", "MAX_STEPS", "MAX_TOKENS", "CurriculumConfig", "CurriculumSpec", "ProxySpec",
           "TrainConfig", "TASK_PARAMS", "TASK_METRICS", "task_metrics", "hop_counts",
           "CURRICULUM_SET", "SAMPLER_CLASSES", "SAMPLER_PARAMS", "SET_BY_SWEEP", "sampler_class"]
