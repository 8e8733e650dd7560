"""The architecture DSL: frozen pydantic models, discriminated on ``kind``.

An :class:`ArchSpec` is either *source* form (it may use sugar: ``num_layers`` +
``layer``, ``hybrid``, ``loop``, ``model.defaults``) or *canonical* form (an explicit
list of layers with every size resolved, and an explicit list of loop regions).
:func:`nas.lower.lower` turns the first into the second; the canonical form is itself
a valid ``ArchSpec``, so it dumps to YAML and loads back unchanged.

Sizes left as ``None`` follow flash-linear-attention's layer defaults or are derived
from the model width when lowered (see each field's description).
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError,
    ValidationInfo, field_validator, model_validator,
)

from .errors import Problem, SpecError

# Caps on counts that lowering and planning turn into Python lists and loops.
MAX_LAYERS = 4096
MAX_LOOPS = 1024
# Sublayer applications in one forward pass (layers × nested T's): what a model may run.
MAX_APPLICATIONS = 1 << 20


MAX_NAME = 255
_NAME = re.compile(r"\w[\w.+-]*")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a spec or space (None: it can). A name becomes a file or
    directory name (``graph``'s ``<name>.png``, ``runs/<name>``), so it is one path piece of
    letters, digits and ``_ . + -``, not starting with ``.``, ``+`` or ``-``."""
    rule = ("a name is letters, digits and '_', '.', '+', '-' (first a letter, digit or '_'), "
            f"at most {MAX_NAME} characters: it names output files")
    if not name:
        return f"is empty; {rule}"
    if len(name) > MAX_NAME:
        return f"has {len(name):,} characters; {rule}"
    if not _NAME.fullmatch(name):
        shown = ascii(name) if len(name) <= 40 else ascii(name[:37])[:-1] + "...'"
        return f"{shown} cannot name a file; {rule}"
    return None


def _check_name(name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


Name = Annotated[str, AfterValidator(_check_name)]


def named_path(folder: str | Path, name: str, suffix: str = "") -> Path:
    """``folder/<name><suffix>``, where a command writes by default for a spec or space
    called ``name``, and never anywhere else: a name that is not one safe path piece is a
    SpecError on ``name``; one too long for a file name with ``suffix`` is shortened to
    fit, ending in a hash of the whole."""
    problem = name_problem(name)
    if problem is not None:
        raise SpecError([Problem("name", problem)])
    stem, limit = name, 255 - len(suffix.encode())
    if len(stem.encode()) > limit:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        stem = stem.encode()[:limit - 13].decode(errors="ignore") + "-" + digest
    path = Path(folder) / f"{stem}{suffix}"
    assert path.parent == Path(folder) and path.name == f"{stem}{suffix}", path
    return path


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"should be a number, not a boolean (got {value})")
    return value


# Sizes are strict ints: YAML's `yes`/`on` are booleans, and 4.0 or "4" are not sizes
# (pydantic's lax mode would take them as 1 and 4). Floats stay lax except for booleans,
# because PyYAML reads `15.7e6` (no exponent sign) as the string "15.7e6".
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, strict=True)]
PosFloat = Annotated[float, BeforeValidator(_no_bool), Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, BeforeValidator(_no_bool), Field(ge=0, allow_inf_nan=False)]
LoopCount = Annotated[int, Field(gt=0, le=MAX_LOOPS, strict=True)]


class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def model_post_init(self, context: Any) -> None:
        # ``kind`` always counts as set, so ``exclude_unset`` dumps keep the discriminator.
        if "kind" in type(self).model_fields:
            self.__pydantic_fields_set__.add("kind")


class NormSpec(Spec):
    """``zero_centered`` (RMSNorm only): the weight is stored as its offset from 1,
    ``rms(x) · (1 + w)`` with w starting at 0 (Qwen3-Next): the same function at init and
    the same parameter count as a plain RMSNorm; weight decay pulls the scale towards 1."""

    kind: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    eps: PosFloat = 1e-6
    zero_centered: bool = False

    @model_validator(mode="after")
    def _zero_centered_rms(self) -> "NormSpec":
        if self.zero_centered and self.kind != "rmsnorm":
            raise ValueError("zero_centered applies to rmsnorm only; remove it or use kind: rmsnorm")
        return self


class GDNSpec(Spec):
    """Gated DeltaNet (fla ``GatedDeltaNet``); defaults are fla's."""

    kind: Literal["gdn"] = "gdn"
    num_heads: PositiveInt = 6
    head_dim: PositiveInt = 256
    expand_v: PosFloat = 2.0
    num_v_heads: PositiveInt | None = None
    use_gate: bool = True
    use_short_conv: bool = True
    conv_size: PositiveInt = 4
    conv_bias: bool = False
    allow_neg_eigval: bool = False
    norm_eps: PosFloat = 1e-5


class DeltaNetSpec(Spec):
    """DeltaNet (fla ``DeltaNet``); head dim = width * expand_k / num_heads."""

    kind: Literal["deltanet"] = "deltanet"
    num_heads: PositiveInt = 4
    expand_k: PosFloat = 1.0
    expand_v: PosFloat = 1.0
    use_beta: bool = True
    use_gate: bool = False
    use_short_conv: bool = True
    conv_size: PositiveInt = 4
    conv_bias: bool = False
    allow_neg_eigval: bool = False
    qk_activation: Literal["silu", "relu", "elu", "identity"] = "silu"
    qk_norm: Literal["l2", "sum"] = "l2"
    norm_eps: PosFloat = 1e-5


class KDASpec(Spec):
    """Kimi Delta Attention (fla ``KimiDeltaAttention``); defaults are fla's."""

    kind: Literal["kda"] = "kda"
    num_heads: PositiveInt = 16
    head_dim: PositiveInt = 128
    expand_v: PosFloat = 1.0
    num_v_heads: PositiveInt | None = None
    use_short_conv: bool = True
    conv_size: PositiveInt = 4
    conv_bias: bool = False
    allow_neg_eigval: bool = False
    norm_eps: PosFloat = 1e-5


class Mamba2Spec(Spec):
    """Mamba-2 (fla ``Mamba2``); ``num_heads=None`` means expand * width / head_dim."""

    kind: Literal["mamba2"] = "mamba2"
    num_heads: PositiveInt | None = None
    head_dim: PositiveInt = 64
    state_size: PositiveInt = 128
    expand: PositiveInt = 2
    n_groups: PositiveInt = 1
    conv_kernel: PositiveInt = 4
    use_conv_bias: bool = True
    use_bias: bool = False
    D_has_hdim: bool = False
    rmsnorm: bool = True
    norm_before_gate: bool = False
    norm_eps: PosFloat = 1e-5
    chunk_size: PositiveInt | None = Field(None, description="the SSD scan's chunk, a kernel setting "
                                           "(same results to round-off); None: chosen from T on CPU "
                                           "(builders.ops.linear.chunk_size_for), fla's own default "
                                           "on the fla backend; a spec stored before issue #21 "
                                           "reads through migrate_arch")


class AttnSpec(Spec):
    """Softmax attention (fla ``Attention``): full (``window=None``) or sliding window.

    ``head_dim=None`` means width / num_heads; ``output_gate`` is the head-specific
    sigmoid gate after SDPA (LT2 §3.4, Gated Attention).

    ``qk_norm``: ``true`` is fla's RMSNorm (eps 1e-5) on q and k; a norm spec is that norm
    (Qwen3: the model's RMSNorm; Qwen3-Next: zero-centred). ``qk_norm_over``: ``head``
    normalises each head over head_dim (one weight of head_dim for q, one for k);
    ``heads`` normalises the whole q projection (num_heads·head_dim) and the whole k
    projection (num_kv_heads·head_dim), OLMo 2's QK-norm. ``rope_dim``: rotary on the first
    ``rope_dim`` channels of each head only (partial rotary; None: all of them), with
    frequencies over ``rope_dim`` as in GPT-NeoX and Qwen3-Next.
    """

    kind: Literal["attn"] = "attn"
    num_heads: PositiveInt = 32
    num_kv_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    window: PositiveInt | None = None
    qkv_bias: bool = False
    qk_norm: bool | NormSpec = False
    qk_norm_over: Literal["head", "heads"] = "head"
    rope_theta: PosFloat | None = 10000.0
    rope_dim: PositiveInt | None = None
    output_gate: bool = False


class DSASpec(Spec):
    """DeepSeek sparse attention: a lightning indexer picks ``topk`` keys per query."""

    kind: Literal["dsa"] = "dsa"
    num_heads: PositiveInt = 32
    num_kv_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    index_heads: PositiveInt = 4
    index_head_dim: PositiveInt = 32
    topk: PositiveInt = 64
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_theta: PosFloat | None = 10000.0
    output_gate: bool = False


class NSASpec(Spec):
    """Native sparse attention (fla ``NativeSparseAttention``); defaults are fla's."""

    kind: Literal["nsa"] = "nsa"
    num_heads: PositiveInt = 64
    num_kv_heads: PositiveInt = 4
    head_dim: PositiveInt = 64
    block_size: PositiveInt = 64
    block_counts: PositiveInt = 16
    window: PositiveInt = 512
    qkv_bias: bool = False
    rope_theta: PosFloat | None = 10000.0


BaseMixer = Annotated[
    Union[GDNSpec, DeltaNetSpec, KDASpec, Mamba2Spec, AttnSpec, DSASpec, NSASpec],
    Field(discriminator="kind"),
]


class ParallelSpec(Spec):
    """Branches run side by side on the same input (Hymba / Falcon-H1 hybrids).

    ``combine``: ``mean`` or ``sum`` of the branch outputs, or ``concat``: the branch
    outputs concatenated on channels and mixed back to width by one linear map.
    Before combining, each branch output may be normalised (``branch_norm``: ``true`` for
    the model's norm, which lowering writes out, or a norm of its own) and scaled by a
    learnable per-channel ``β`` initialised to 1 (``branch_scale``): Hymba's
    ``β₁·norm(attn) + β₂·norm(ssm)``, here after each branch's own output projection.
    """

    kind: Literal["parallel"] = "parallel"
    branches: tuple[BaseMixer, ...] = Field(min_length=2)
    combine: Literal["mean", "sum", "concat"] = "mean"
    branch_norm: bool | NormSpec = False
    branch_scale: bool = False


# switch weights: how far from 1 their sum may be (YAML-written thirds, float rounding)
WEIGHT_TOLERANCE = 1e-6


class SwitchSpec(Spec):
    """A layer that holds several mixers and runs one of them per forward pass.

    The lowering of ``placement: random`` (LT2 §3.3): the hybrid pattern is resampled
    every forward pass (or optimizer step: ``sampling_per``) in training, and evaluation
    averages ``eval_samples`` sampled patterns. ``weights[i]`` is the probability that
    option i runs in this layer, the one figure the cost model and the placement sampler
    both read; lowering fills it from ``random_placement`` (see
    :func:`nas.placement.option_weights`).
    """

    kind: Literal["switch"] = "switch"
    options: tuple[BaseMixer, ...] = Field(min_length=2)
    weights: tuple[NonNegFloat, ...] | None = None

    @field_validator("weights")
    @classmethod
    def _a_distribution(cls, weights, info: ValidationInfo):
        options = info.data.get("options")
        if weights is None:
            return weights
        if options is not None and len(weights) != len(options):
            raise ValueError(f"{len(weights)} weights for {len(options)} options; give one "
                             "probability per option, in option order")
        if abs(sum(weights) - 1) > WEIGHT_TOLERANCE:
            raise ValueError(f"weights sum to {sum(weights):g}, not 1; they are the "
                             "probabilities that each option runs")
        return weights


def sub_mixers(op) -> tuple[str, tuple] | None:
    """``(field, children)`` of a composite mixer (a parallel's ``branches``, a switch's
    ``options``); None for any other op. The one place that knows both shapes."""
    if isinstance(op, ParallelSpec):
        return "branches", op.branches
    if isinstance(op, SwitchSpec):
        return "options", op.options
    return None


MixerSpec = Annotated[
    Union[GDNSpec, DeltaNetSpec, KDASpec, Mamba2Spec, AttnSpec, DSASpec, NSASpec,
          ParallelSpec, SwitchSpec],
    Field(discriminator="kind"),
]
MIXER_KINDS = ("gdn", "deltanet", "kda", "mamba2", "attn", "dsa", "nsa", "parallel", "switch")


class SwiGLUSpec(Spec):
    """SwiGLU FFN (fla ``GatedMLP``); ``hidden_size=None`` is fla's default:
    ``int(width * 4 * 2 / 3)`` rounded up to a multiple of 256."""

    kind: Literal["swiglu"] = "swiglu"
    hidden_size: PositiveInt | None = None


class MoESpec(Spec):
    """Top-k routed SwiGLU experts with an optional shared expert; ``shared_expert_gate``
    scales the shared expert's output by ``sigmoid(w · x)`` per token (one weight vector
    of width d, Qwen2-MoE / Qwen3-Next)."""

    kind: Literal["moe"] = "moe"
    num_experts: PositiveInt = 8
    top_k: PositiveInt = 2
    expert_hidden: PositiveInt | None = None
    shared_expert_hidden: NonNegInt = 0
    shared_expert_gate: bool = False
    aux_loss_coef: NonNegFloat = 0.01

    @field_validator("top_k")
    @classmethod
    def _topk_fits(cls, top_k: int, info: ValidationInfo) -> int:
        num_experts = info.data.get("num_experts")
        if num_experts is not None and top_k > num_experts:
            raise ValueError(f"top_k={top_k} exceeds num_experts={num_experts}; "
                             "use top_k <= num_experts")
        return top_k


class NoFFNSpec(Spec):
    """No channel mixer in this layer (the FFN sublayer is the identity)."""

    kind: Literal["none"] = "none"


FFNSpec = Annotated[Union[SwiGLUSpec, MoESpec, NoFFNSpec], Field(discriminator="kind")]
FFN_KINDS = ("swiglu", "moe", "none")
OpName = Literal["mixer", "ffn"]


class LayerSpec(Spec):
    """One physical layer: ``A(h) = h + Mixer(Norm(h))`` then ``F(h) = h + FFN(Norm(h))``.

    ``norm_placement: post`` normalises each sublayer's output instead of its input,
    ``A(h) = h + Norm(Mixer(h))``, ``F(h) = h + Norm(FFN(h))`` (OLMo 2; OLMo-Hybrid's
    attention layers): the same two norms, in the other place."""

    mixer: MixerSpec
    ffn: FFNSpec = SwiGLUSpec()
    norm_placement: Literal["pre", "post"] = "pre"


class ModelSpec(Spec):
    """Global geometry. ``defaults`` maps an op kind to field values that every op of
    that kind starts from (``{gdn: {num_heads: 4, head_dim: 72}}``); layers override."""

    vocab_size: PositiveInt
    width: PositiveInt
    tie_embeddings: bool = True
    norm: NormSpec = NormSpec()
    init_std: PosFloat = 0.02
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)


class OpAddr(Spec):
    """A sublayer: ``layer`` index and ``op`` (``mixer`` or ``ffn``)."""

    layer: NonNegInt
    op: OpName

    @property
    def flat(self) -> int:
        return 2 * self.layer + (0 if self.op == "mixer" else 1)

    def __str__(self) -> str:
        return f"layers[{self.layer}].{self.op}"


class PlainUpdate(Spec):
    """``h_τ = f(h_{τ-1})``: plain composition."""

    kind: Literal["plain"] = "plain"


class ResidualGateUpdate(Spec):
    """LT2/MixerLoop: ``h_τ = f(h_{τ-1}) + ρ_τ ⊙ h_{τ-1}``, ρ[T, d] zero-initialised.
    ``shared``: one ρ for every region that asks for a shared gate (MixerLoop shares it
    across all layers); otherwise each region has its own."""

    kind: Literal["residual_gate"] = "residual_gate"
    shared: bool = True


class GatedStepUpdate(Spec):
    """ELR: ``h ← h + g ⊙ (f(h) − h)`` from the second iteration on, with
    ``g = σ(W [h; f(h)] + b)`` per token and channel; the first iteration is plain, so
    one loop is exactly the plain model."""

    kind: Literal["gated_step"] = "gated_step"


class ReinjectUpdate(Spec):
    """Huginn/Parcae input re-injection of the region's input ``e`` before each
    iteration after the first: ``add``: ``h + e``; ``concat``: ``W [h; e]`` (W starts as
    ``[I, 0]``); ``diagonal``: ``a ⊙ h + b ⊙ e`` with ``a = exp(−softplus(·)) ∈ (0, 1)``
    (stable).

    ``initial_state``: ``input`` (the first iteration reads ``e`` itself); ``zeros`` or
    ``random`` (Huginn: ``s₀ ~ N(0, init_std²)``, drawn per forward pass): the state starts
    there and re-injection runs before every iteration, the first included."""

    kind: Literal["reinject"] = "reinject"
    mode: Literal["add", "concat", "diagonal"] = "add"
    initial_state: Literal["input", "zeros", "random"] = "input"
    init_std: PosFloat = 1.0


UpdateRule = Annotated[
    Union[PlainUpdate, ResidualGateUpdate, GatedStepUpdate, ReinjectUpdate],
    Field(discriminator="kind"),
]


class IterOverride(Spec):
    """Loop-level schedule entry: at ``iteration`` (0-based) the mixer of ``layer`` runs
    with a different ``window`` (``full`` removes the window) or ``topk``."""

    iteration: NonNegInt
    layer: NonNegInt
    window: PositiveInt | Literal["full"] | None = None
    topk: PositiveInt | None = None

    @model_validator(mode="after")
    def _sets_something(self) -> "IterOverride":
        if self.window is None and self.topk is None:
            raise ValueError("an override must set window or topk")
        return self


class LoopRegion(Spec):
    """Canonical loop: the contiguous sublayers ``start..end`` (inclusive, execution
    order) applied ``T`` times with shared weights.

    ``iteration_norm``: a norm applied to the state after every iteration (Ouro's sandwich
    norm). ``truncate``: truncated backpropagation through the iterations: only the last
    ``truncate`` iterations carry gradient (the state entering them is detached; the
    region input re-injected into them keeps its gradient, as in Huginn)."""

    start: OpAddr
    end: OpAddr
    T: LoopCount
    update: UpdateRule = PlainUpdate()
    conditioning: Literal["none", "index", "index_budget"] = "none"
    schedule: tuple[IterOverride, ...] = ()
    routing_replay: bool = False
    iteration_norm: NormSpec | None = None
    truncate: LoopCount | None = None


class SelectSpec(Spec):
    """Which sublayers a selective loop repeats."""

    ops: tuple[OpName, ...] = ("mixer",)
    kinds: tuple[str, ...] | None = None
    layers: tuple[NonNegInt, NonNegInt] | None = None


class LoopSugar(Spec):
    """Loop boundary sugar, lowered to :class:`LoopRegion` s.

    - ``none``: no loop. ``block``: the whole stack (FullLoop). ``mixer`` / ``ffn``:
      each layer's mixer / FFN on its own (MixerLoop). ``selective``: the ops chosen by
      ``select``, each on its own (``unit: op``) or as one span (``unit: span``).
      ``elr``: ``prelude`` layers, then ``recurrent`` layers looped, then ``coda``.
    - ``windows``: a loop-level schedule, one window per iteration (``full`` or an int)
      for every attention mixer in the loop (LT2's coarse-to-fine full→swa512→…).
    - ``topk``: the same for DSA mixers, one top-k per iteration.
    - ``iteration_norm``: the model's norm after every iteration (Ouro); ``truncate``: only
      the last n iterations carry gradient (see :class:`LoopRegion`).
    - ``ffn``: the FFN of every layer this loop covers (e.g. MoE only in ELR's recurrent
      block), instead of the layer template's.
    """

    boundary: Literal["none", "block", "mixer", "ffn", "selective", "elr"]
    T: LoopCount = 1
    update: UpdateRule = PlainUpdate()
    conditioning: Literal["none", "index", "index_budget"] = "none"
    select: SelectSpec | None = None
    unit: Literal["op", "span"] = "op"
    prelude: NonNegInt | None = None
    recurrent: PositiveInt | None = None
    coda: NonNegInt | None = None
    windows: tuple[PositiveInt | Literal["full"], ...] | None = None
    topk: tuple[PositiveInt, ...] | None = None
    routing_replay: bool = False
    iteration_norm: bool = False
    truncate: LoopCount | None = None
    ffn: FFNSpec | None = None


def poisson_lognormal_pmf(mean: float, sigma: float, max_k: int) -> tuple[float, ...]:
    """``P(k)`` for k = 1..max_k of Huginn's loop count: ``τ ~ N(log mean − σ²/2, σ)``,
    ``k = min(Poisson(e^τ) + 1, max_k)`` (the mass above ``max_k`` lands on it; E[e^τ] =
    mean). The integral over τ is a trapezoid sum on ±12σ (4001 points: the integrand is
    smooth and Gaussian-tailed, so the sum is exact to ~1e-12)."""
    import numpy as np

    with np.errstate(all="ignore"):  # a huge sigma: NaNs, reported by the caller
        j = np.arange(max_k - 1)[:, None]  # Poisson outcomes 0 .. max_k - 2
        log_fact = np.array([math.lgamma(x + 1) for x in range(max_k - 1)])[:, None]
        if sigma == 0:
            tau, w = np.array([math.log(mean)]), np.array([1.0])
        else:
            mu = math.log(mean) - sigma * sigma / 2
            tau = np.linspace(mu - 12 * sigma, mu + 12 * sigma, 4001)
            w = np.exp(-0.5 * ((tau - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
            w = w * (tau[1] - tau[0]) * np.r_[0.5, np.ones(len(tau) - 2), 0.5]
        pmf = np.exp(j * tau[None, :] - np.exp(tau)[None, :] - log_fact) @ w
    head = [float(x) for x in pmf]
    return (*head, max(0.0, 1.0 - sum(head)))


# loop-count distribution kinds and the fields each one takes (besides kind and per)
_DIST_FIELDS = {"categorical": ("values", "weights"), "fixed": ("k",), "uniform": ("low", "high"),
                "poisson_lognormal": ("mean", "sigma", "max")}


# each parameter's field type: a table is computed only from parameters that pass it
_DIST_PARAMS = {f: TypeAdapter(tp) for f, tp in (("k", LoopCount), ("low", LoopCount), ("high", LoopCount),
                                                 ("max", LoopCount), ("mean", PosFloat), ("sigma", NonNegFloat))}
_DIST_VALUES = TypeAdapter(tuple[LoopCount, ...])
_DIST_WEIGHTS = TypeAdapter(tuple[NonNegFloat, ...])


def _dist_table(data: dict) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """``(values, weights)`` of a non-categorical loop-count distribution; None when one
    of its parameters is not a value of its field's type (a list, a string, a boolean, a
    number out of range: that field's own validation then names it)."""
    kind = data["kind"]
    missing = [f for f in _DIST_FIELDS[kind] if data.get(f) is None]
    if missing:
        raise ValueError(f"kind {kind} needs {', '.join(_DIST_FIELDS[kind])}; missing {', '.join(missing)}")
    try:
        p = {f: _DIST_PARAMS[f].validate_python(data[f]) for f in _DIST_FIELDS[kind]}
    except ValidationError:
        return None
    if kind == "fixed":
        return (p["k"],), (1.0,)
    if kind == "uniform":
        lo, hi = p["low"], p["high"]
        if not lo <= hi:
            raise ValueError(f"uniform needs integers 1 <= low <= high <= {MAX_LOOPS} (got {lo}, {hi})")
        return tuple(range(lo, hi + 1)), (1.0 / (hi - lo + 1),) * (hi - lo + 1)
    mean, sigma, top = p["mean"], p["sigma"], p["max"]
    if top < 2:
        raise ValueError(f"poisson_lognormal needs mean > 0, sigma >= 0 and an integer max in "
                         f"2..{MAX_LOOPS} (got mean={mean}, sigma={sigma}, max={top})")
    pmf = poisson_lognormal_pmf(mean, sigma, top)
    if not all(math.isfinite(w) for w in pmf):
        raise ValueError(f"poisson_lognormal with mean={mean:g}, sigma={sigma:g} has no finite "
                         "probabilities; use a smaller sigma (Huginn's is 0.5)")
    return tuple(range(1, top + 1)), pmf


class LoopDist(Spec):
    """A distribution over loop counts, and how often it is drawn.

    ``kind``: ``categorical`` (``values`` with ``weights``; the default is ELR's
    single-loop coverage: 2nd/3rd/4th loops in 67.5/45/22.5% of samples, mean 2.35),
    ``fixed`` (``k``), ``uniform`` (``low..high``), ``poisson_lognormal`` (Huginn:
    ``τ ~ N(log mean − σ²/2, σ)``, ``k = Poisson(e^τ) + 1`` clamped at ``max``). Every kind
    is written out as ``values`` / ``weights`` (the exact probabilities, which the cost
    model's expectations and the sampler read); a dumped spec reloads to the same table.
    ``per``: a fresh draw for every ``row`` of a micro-batch (ELR), every ``micro_batch``,
    or every optimizer ``step`` (Huginn)."""

    kind: Literal["categorical", "fixed", "uniform", "poisson_lognormal"] = "categorical"
    values: tuple[LoopCount, ...] = Field((1, 2, 3, 4), min_length=1)
    weights: tuple[NonNegFloat, ...] = Field((0.325, 0.225, 0.225, 0.225), min_length=1)
    k: LoopCount | None = None
    low: LoopCount | None = None
    high: LoopCount | None = None
    mean: PosFloat | None = None
    sigma: NonNegFloat | None = None
    max: LoopCount | None = None
    per: Literal["row", "micro_batch", "step"] = "row"

    @model_validator(mode="before")
    @classmethod
    def _tabulate(cls, data: Any) -> Any:
        # anything malformed is left as written: field validation names the field
        if not isinstance(data, dict) or not isinstance(kind := data.get("kind", "categorical"), str) \
                or kind not in _DIST_FIELDS:
            return data
        stray = [f for fields in _DIST_FIELDS.values() for f in fields
                 if f not in _DIST_FIELDS[kind] and data.get(f) is not None
                 and not (f in ("values", "weights"))]
        if stray:
            raise ValueError(f"{', '.join(stray)} do not apply to kind {kind}; remove them")
        if kind == "categorical" or (table := _dist_table(data)) is None:
            return data
        values, weights = table
        written = data.get("values"), data.get("weights")
        if written != (None, None):
            try:
                given = (() if written[0] is None else _DIST_VALUES.validate_python(written[0]),
                         () if written[1] is None else _DIST_WEIGHTS.validate_python(written[1]))
            except ValidationError:
                return data
            if given[0] != values or len(given[1]) != len(weights) \
                    or any(abs(a - b) > 1e-12 for a, b in zip(given[1], weights)):
                raise ValueError(f"values and weights follow from kind {kind} and its parameters; "
                                 "remove them")
        return {**data, "values": values, "weights": weights}

    @field_validator("weights")
    @classmethod
    def _one_per_value(cls, weights: tuple[float, ...], info: ValidationInfo) -> tuple[float, ...]:
        values = info.data.get("values")
        if values is not None and len(values) != len(weights):
            raise ValueError(f"values has {len(values)} entries but weights has "
                             f"{len(weights)}; give one weight per value")
        if sum(weights) <= 0:
            raise ValueError("weights must not all be zero")
        return weights


class ElasticSpec(Spec):
    """ELR elastic depth: micro-batches inside one optimizer update run loop counts drawn
    from ``train``, from ``switch_at`` (fraction of training) on; one checkpoint is then
    evaluated at each count in ``eval``."""

    train: LoopDist = LoopDist()
    switch_at: Annotated[float, Field(ge=0, lt=1)] = 0.0
    eval: tuple[LoopCount, ...] = (1, 2, 3, 4)


class HybridSpec(Spec):
    """Hybrid sugar: ``ratio`` over mixer names (a kind, or a key of ``mixers``) and a
    ``placement``: ``interleave``, ``bookend``, ``front``, ``back``, ``random``, or an
    explicit per-layer list of names.

    ``sampling`` (``placement: random`` only): ``ratio`` draws each pattern as a
    permutation at exactly the ratio's layer counts (LT2, PostNAS); ``uniform`` lets every
    layer pick its mixer on its own, name i with probability ``ratio[i] / Σ ratio`` (a
    one-shot supernet's uniform path sampling). ``sampling_per`` (``placement: random``
    only): a fresh pattern for every training ``forward`` pass (LT2), or one per optimizer
    ``step``, shared by its micro-batches and loop-count groups (the trainer draws it with
    ``LoopLM.start_step``). Either way every pattern has the same distribution, so the
    cost model prices both alike."""

    ratio: dict[str, PositiveInt] = Field(min_length=1)
    placement: Literal["interleave", "bookend", "front", "back", "random"] | tuple[str, ...] = "interleave"
    mixers: dict[str, MixerSpec] = Field(default_factory=dict)
    eval_samples: PositiveInt = 5
    sampling: Literal["ratio", "uniform"] = "ratio"
    sampling_per: Literal["forward", "step"] = "forward"


class MatchSpec(Spec):
    """Budget matching: solve for ``vary`` so that ``unique_params`` or
    ``projection_flops`` hits the target within ``tolerance`` (relative). ``scale`` grows
    the width, every head count and FFN width together by one factor, each head's dimension
    kept, and lands the target by the FFN width (:func:`nas.budget.scale_arch`)."""

    unique_params: PosFloat | None = None
    projection_flops: PosFloat | None = None
    vary: Literal["ffn_hidden", "width", "num_layers", "scale"] = "ffn_hidden"
    tolerance: PosFloat = 0.01

    @model_validator(mode="after")
    def _one_target(self) -> "MatchSpec":
        if (self.unique_params is None) == (self.projection_flops is None):
            raise ValueError("set exactly one of unique_params or projection_flops")
        return self


class ArchSpec(Spec):
    """An architecture, in source or canonical form (see module docstring)."""

    name: Name = "arch"
    description: str = ""
    model: ModelSpec
    layers: tuple[LayerSpec, ...] | None = Field(None, max_length=MAX_LAYERS)
    num_layers: Annotated[int, Field(gt=0, le=MAX_LAYERS, strict=True)] | None = None
    layer: LayerSpec | None = None
    hybrid: HybridSpec | None = None
    loop: LoopSugar | tuple[LoopSugar, ...] | None = None
    loops: tuple[LoopRegion, ...] = ()
    elastic: ElasticSpec | None = None
    kv_policy: Literal["per_loop", "last_loop"] = "per_loop"
    random_placement: HybridSpec | None = None
    match: MatchSpec | None = None

    @property
    def is_canonical(self) -> bool:
        return (self.layers is not None and self.num_layers is None and self.layer is None
                and self.hybrid is None and self.loop is None and self.match is None
                and not self.model.defaults
                and all(not isinstance(l.mixer, ParallelSpec) or l.mixer.branch_norm is not True
                        for l in self.layers)
                and all(not isinstance(l.mixer, SwitchSpec) or l.mixer.weights is not None
                        for l in self.layers))

    @property
    def L(self) -> int:
        assert self.layers is not None, "lower() the spec first"
        return len(self.layers)


def migrate_arch(data: Any) -> Any:
    """A spec as a record or checkpoint stored it (a ``model_dump``), brought to today's
    before it is validated; the one migration of stored specs, each step named by the issue
    that changed what a stored value means:

    - issue #21: ``Mamba2Spec.chunk_size`` defaulted to 256 and every canonical spec wrote
      it out, meaning "fla's default, chosen from T on CPU"; that is ``None`` now. A spec
      stored before #21 (an old checkpoint's fingerprint) so builds, and compares, as it did.

    A spec a person writes is read as written: there ``chunk_size: 256`` is a chunk of 256."""
    if isinstance(data, dict):
        out = {k: migrate_arch(v) for k, v in data.items()}
        if out.get("kind") == "mamba2" and out.get("chunk_size") == 256:
            out["chunk_size"] = None
        return out
    if isinstance(data, list | tuple):
        return type(data)(migrate_arch(v) for v in data)
    return data


def stored_spec(data: Any) -> ArchSpec:
    """A stored spec (a trial record's canonical ``arch``, a checkpoint's, a trainer
    result's) as today's :class:`ArchSpec`: :func:`migrate_arch`, then validated. Every
    reader of a stored spec goes through here (tests/project checks it), so two stored copies
    of one spec compare equal whichever era wrote them."""
    return ArchSpec.model_validate(migrate_arch(data))
