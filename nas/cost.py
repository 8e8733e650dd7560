"""The exact cost model of a canonical spec: parameters, projection compute, sequence
mixing, training FLOPs and inference memory. Pure functions over specs; no torch.

Conventions, derived where each quantity is computed:

- One FLOP is one multiply or one add, so a weight of ``a × b`` applied to one token costs
  ``2ab``: projection compute is 2 × parameters per token.
- *Projection compute* (MixerLoop §3.3): ``C_A`` = 2 × every parameter of a mixer (convs,
  a/b projections, ``A_log``, gate norms included: the paper counts "all mixer
  parameters"), ``C_F`` = 2 × the FFN's *active* parameters (MoE: router + ``top_k``
  experts + the shared expert; the later iterations of a routing-replay region reuse the
  first one's routing and skip the router), ``C_H = 2·V·d`` (the embedding lookup is
  free). Pre-norms and the final norm are elementwise, not projections, and are not
  counted. Each op is charged once per application in the execution plan, so NoLoop
  ``L(C_A + C_F) + C_H``, MixerLoop ``L(T·C_A + C_F) + C_H`` and FullLoop
  ``T·L(C_A + C_F) + C_H`` are special cases.
- Loop-extra matmuls (ELR's gated step, concat re-injection) are reported apart from
  projection compute; elementwise extras (ρ, diagonal re-injection, conditioning tables)
  cost no FLOPs.
- FLOPs are per token of one forward pass. ``loops=k`` replaces every region's ``T`` by
  ``k``, as :func:`nas.plan.plan` does.
- A ``switch`` mixer (random placement) costs the *expected* FLOPs of its options, each
  weighted by the probability ``count/L`` that a resampled pattern puts it in a layer; its
  memory is the *largest* option's, the amount to provision.

Parameter names match the compiled model: ``embed``, ``lm_head`` (untied only),
``layers.{i}.mixer_norm``, ``layers.{i}.mixer``, ``layers.{i}.ffn_norm``,
``layers.{i}.ffn`` (norm and FFN absent for kind ``none``), ``norm``, ``rho``,
``loops.{j}.*``.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

from .lower import ratio_counts
from .plan import max_loops
from .spec import (
    ArchSpec, AttnSpec, DeltaNetSpec, DSASpec, GDNSpec, KDASpec, Mamba2Spec, MoESpec,
    NoFFNSpec, NSASpec, ParallelSpec, Spec, SwiGLUSpec, SwitchSpec,
)

DEFAULT_SEQ_LEN = 1024
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

_PARAMS: dict[type, Callable[[Spec, int], int]] = {}
_SEQ: dict[type, Callable[[Spec, int, int], float]] = {}
_KV: dict[type, Callable[[Spec, int, int], int]] = {}
_STATE: dict[type, Callable[[Spec, int], int]] = {}


def _rule(table: dict, *types: type) -> Callable:
    """Register ``fn`` as ``table``'s rule for each spec type (once)."""
    def deco(fn: Callable) -> Callable:
        for t in types:
            if t in table:
                raise ValueError(f"a rule for {t.__name__} is already registered")
            table[t] = fn
        return fn
    return deco


# ---------------------------------------------------------------- parameters per op


def _conv(channels: int, size: int, bias: bool) -> int:
    """A depthwise causal conv (fla ``ShortConvolution``): weight (C, 1, W) + bias (C)."""
    return channels * size + (channels if bias else 0)


def _delta_dims(op: GDNSpec | KDASpec) -> tuple[int, int, int, int, int]:
    """fla's GDN/KDA head layout: K = H·dk, V = HV·dv, dv = head_dim·expand_v."""
    hv = op.num_v_heads or op.num_heads
    dv = int(op.head_dim * op.expand_v)
    return op.num_heads * op.head_dim, hv * dv, hv, op.head_dim, dv


def _deltanet_dims(op: DeltaNetSpec, d: int) -> tuple[int, int, int, int]:
    """fla ``DeltaNet``: K = round(d·expand_k), V = round(d·expand_v), split over H heads."""
    k, v = round(d * op.expand_k), round(d * op.expand_v)
    return k, v, k // op.num_heads, v // op.num_heads


def _mamba2_dims(op: Mamba2Spec, d: int) -> tuple[int, int, int]:
    """fla ``Mamba2``: inner I = expand·d, H = I / head_dim, conv over x, B, C."""
    inner = op.expand * d
    heads = op.num_heads or inner // op.head_dim
    return inner, heads, inner + 2 * op.n_groups * op.state_size


def _head_dim(op: AttnSpec | DSASpec, d: int) -> int:
    return op.head_dim or d // op.num_heads


@_rule(_PARAMS, GDNSpec)
def _gdn_params(op: GDNSpec, d: int) -> int:
    """fla ``GatedDeltaNet``: q, k (d→K), v (d→V), a, b (d→HV), A_log and dt_bias (HV
    each), q/k/v short convs ((2K + V)·W [+ bias]), g_proj (d→V) when ``use_gate``,
    o_norm (dv, gated or not), o_proj (V→d); no Linear has a bias."""
    k, v, hv, _, dv = _delta_dims(op)
    conv = _conv(2 * k + v, op.conv_size, op.conv_bias) if op.use_short_conv else 0
    return 2 * d * k + d * v + 2 * d * hv + 2 * hv + conv + (d * v if op.use_gate else 0) + dv + v * d


@_rule(_PARAMS, DeltaNetSpec)
def _deltanet_params(op: DeltaNetSpec, d: int) -> int:
    """fla ``DeltaNet``: q, k (d→K), v (d→V), b_proj (d→H) when ``use_beta``, q/k/v short
    convs, g_proj (d→V) when ``use_gate``, o_norm (dv), o_proj (V→d)."""
    k, v, _, dv = _deltanet_dims(op, d)
    conv = _conv(2 * k + v, op.conv_size, op.conv_bias) if op.use_short_conv else 0
    beta = d * op.num_heads if op.use_beta else 0
    return 2 * d * k + d * v + beta + conv + (d * v if op.use_gate else 0) + dv + v * d


@_rule(_PARAMS, KDASpec)
def _kda_params(op: KDASpec, d: int) -> int:
    """fla ``KimiDeltaAttention``: q, k, v, short convs, f_proj (d→dv→G, G = HV·dk),
    b_proj (d→HV), A_log (HV), dt_bias (G), g_proj (d→dv→V, the second with bias),
    o_norm (dv), o_proj (V→d)."""
    k, v, hv, dk, dv = _delta_dims(op)
    gate = hv * dk
    conv = _conv(2 * k + v, op.conv_size, op.conv_bias) if op.use_short_conv else 0
    return (2 * d * k + d * v + conv + d * dv + dv * gate + d * hv + hv + gate
            + d * dv + dv * v + v + dv + v * d)


@_rule(_PARAMS, Mamba2Spec)
def _mamba2_params(op: Mamba2Spec, d: int) -> int:
    """fla ``Mamba2``: in_proj (d → I + conv_dim + H, bias if ``use_bias``), conv1d over
    conv_dim = I + 2·G·N, dt_bias and A_log (H), gated RMSNorm (I) when ``rmsnorm``,
    D (I if ``D_has_hdim`` else H), out_proj (I→d, bias if ``use_bias``)."""
    inner, heads, conv_dim = _mamba2_dims(op, d)
    proj = inner + conv_dim + heads
    bias = proj + d if op.use_bias else 0
    return (d * proj + _conv(conv_dim, op.conv_kernel, op.use_conv_bias) + 2 * heads
            + (inner if op.rmsnorm else 0) + (inner if op.D_has_hdim else heads) + inner * d + bias)


def _attn_core_params(op: AttnSpec | DSASpec, d: int) -> int:
    """q (d→H·hd), k, v (d→Hkv·hd), biases when ``qkv_bias``, o (H·hd→d, no bias),
    q_norm/k_norm (hd each) when ``qk_norm``, g_proj (d→H·hd, no bias) when ``output_gate``.
    With hd = d/H this is fla ``Attention`` exactly (which has no gate)."""
    hd = _head_dim(op, d)
    q, kv = op.num_heads * hd, (op.num_kv_heads or op.num_heads) * hd
    bias = q + 2 * kv if op.qkv_bias else 0
    return (2 * d * q + 2 * d * kv + bias + (2 * hd if op.qk_norm else 0)
            + (d * q if op.output_gate else 0))


@_rule(_PARAMS, AttnSpec)
def _attn_params(op: AttnSpec, d: int) -> int:
    return _attn_core_params(op, d)


@_rule(_PARAMS, DSASpec)
def _dsa_params(op: DSASpec, d: int) -> int:
    """``builders.layers.attention.DeepSeekSparseAttention``: the attention projections plus
    ``indexer.q_proj`` (d→HI·DI), ``indexer.k_proj`` (d→DI), ``indexer.weights_proj``
    (d→HI), all without bias."""
    return _attn_core_params(op, d) + d * (op.index_heads * op.index_head_dim + op.index_head_dim
                                           + op.index_heads)


@_rule(_PARAMS, NSASpec)
def _nsa_params(op: NSASpec, d: int) -> int:
    """fla ``NativeSparseAttention``: q (d→H·hd), k, v (d→Hkv·hd) [+ bias], g_proj (d→3H,
    a gate per head for the compressed, selected and window branches), o (H·hd→d)."""
    q, kv = op.num_heads * op.head_dim, op.num_kv_heads * op.head_dim
    return 2 * d * q + 2 * d * kv + (q + 2 * kv if op.qkv_bias else 0) + 3 * d * op.num_heads


@_rule(_PARAMS, ParallelSpec)
def _parallel_params(op: ParallelSpec, d: int) -> int:
    """Sum of the branches, plus ``proj`` (n·d → d, no bias) for ``concat``."""
    proj = len(op.branches) * d * d if op.combine == "concat" else 0
    return sum(op_params(b, d) for b in op.branches) + proj


@_rule(_PARAMS, SwitchSpec)
def _switch_params(op: SwitchSpec, d: int) -> int:
    """Every option's weights exist in the model."""
    return sum(op_params(o, d) for o in op.options)


@_rule(_PARAMS, SwiGLUSpec)
def _swiglu_params(op: SwiGLUSpec, d: int) -> int:
    """fla ``GatedMLP``: gate and up (d→h), down (h→d), no bias."""
    return 3 * d * op.hidden_size


def moe_params(op: MoESpec, d: int, experts: int | None = None) -> int:
    """Router ``gate`` (d→E, no bias), ``experts`` SwiGLU experts of ``expert_hidden``
    (all E when None), and the shared SwiGLU expert of ``shared_expert_hidden`` (if > 0)."""
    n = op.num_experts if experts is None else experts
    return d * op.num_experts + 3 * d * (n * op.expert_hidden + op.shared_expert_hidden)


@_rule(_PARAMS, MoESpec)
def _moe_params(op: MoESpec, d: int) -> int:
    return moe_params(op, d)


@_rule(_PARAMS, NoFFNSpec)
def _none_params(op: NoFFNSpec, d: int) -> int:
    return 0


@functools.lru_cache(maxsize=65536)
def op_params(op: Spec, width: int) -> int:
    """Parameters of one op (mixer or FFN spec) at model width ``width``."""
    return _PARAMS[type(op)](op, width)


@functools.lru_cache(maxsize=65536)
def op_active_params(op: Spec, width: int) -> int:
    """Parameters one token runs through: all of them, except MoE (router + top_k experts +
    shared expert) and parallel mixers (the sum over branches of theirs)."""
    if isinstance(op, MoESpec):
        return moe_params(op, width, op.top_k)
    if isinstance(op, ParallelSpec):
        proj = len(op.branches) * width * width if op.combine == "concat" else 0
        return sum(op_active_params(b, width) for b in op.branches) + proj
    if isinstance(op, SwitchSpec):
        raise ValueError("a switch runs one option; price its options (see layer_choices)")
    return op_params(op, width)


def op_projection_flops(op: Spec, width: int) -> int:
    """``C_A`` or ``C_F`` of one op: 2 × its active parameters (one application, per token)."""
    return 2 * op_active_params(op, width)


# ---------------------------------------------------------------- sequence mixing per op


def mean_keys(n: int, window: int | None) -> float:
    """Mean over positions t = 1..n of the keys a causal query sees, ``min(t, w)``:
    ``Σ_t min(t, w) = n(n+1)/2`` when ``n ≤ w`` (or no window), else
    ``w(w+1)/2 + (n − w)·w``; divided by n."""
    if window is None or n <= window:
        return (n + 1) / 2
    return (window * (window + 1) / 2 + (n - window) * window) / n


def mean_blocks(n: int, block: int) -> float:
    """Mean over positions of NSA's visible compressed blocks: 0-based position i sees the
    blocks ending before it, ``⌊i / b⌋``; ``Σ_{i<n} ⌊i/b⌋ = b·q(q−1)/2 + r·q`` with
    ``n = qb + r``; divided by n."""
    q, r = divmod(n, block)
    return (block * q * (q - 1) / 2 + r * q) / n


@_rule(_SEQ, AttnSpec)
def _attn_seq(op: AttnSpec, d: int, n: int) -> float:
    """QKᵀ and AV: each visible key costs 2·hd FLOPs per query head for the score and 2·hd
    for the weighted value, so ``4·H·hd·mean_keys(n, window)`` (softmax not counted)."""
    return 4 * op.num_heads * _head_dim(op, d) * mean_keys(n, op.window)


@_rule(_SEQ, DSASpec)
def _dsa_seq(op: DSASpec, d: int, n: int) -> float:
    """Lightning indexer over every causal key (``2·HI·DI`` for the head scores and
    ``2·HI`` for their weighted sum, per key), then attention over ``min(t, topk)`` keys.
    Top-k selection is comparisons, not FLOPs."""
    indexer = 2 * op.index_heads * (op.index_head_dim + 1) * mean_keys(n, None)
    return indexer + 4 * op.num_heads * _head_dim(op, d) * mean_keys(n, op.topk)


@_rule(_SEQ, NSASpec)
def _nsa_seq(op: NSASpec, d: int, n: int) -> float:
    """Attention (``4·H·hd`` per key) over three key sets: the visible compressed blocks
    (:func:`mean_blocks`), the tokens of the selected blocks, counted at their bound
    ``min(t, block_counts·block_size)``, and the sliding window ``min(t, window)``
    (``window=None`` after a ``full`` override: all t). Block scores reuse the compressed
    branch's attention; mean pooling is not a matmul."""
    keys = (mean_blocks(n, op.block_size) + mean_keys(n, op.block_counts * op.block_size)
            + mean_keys(n, op.window))
    return 4 * op.num_heads * op.head_dim * keys


@_rule(_SEQ, GDNSpec, KDASpec)
def _gated_delta_seq(op: GDNSpec | KDASpec, d: int, n: int) -> float:
    """Recurrent form, per head with a (dk × dv) state S and independent of n: decay
    ``αS`` (dk·dv), retrieval ``Sᵀk`` (2·dk·dv), rank-1 delta update (2·dk·dv), readout
    ``Sᵀq`` (2·dk·dv): ``7·HV·dk·dv``. (Chunked kernels spend more for the same result;
    short convs are parameters, counted in projection compute.)"""
    _, _, hv, dk, dv = _delta_dims(op)
    return 7 * hv * dk * dv


@_rule(_SEQ, DeltaNetSpec)
def _deltanet_seq(op: DeltaNetSpec, d: int, n: int) -> float:
    """As gated delta but without decay: ``6·H·dk·dv``."""
    _, _, dk, dv = _deltanet_dims(op, d)
    return 6 * op.num_heads * dk * dv


@_rule(_SEQ, Mamba2Spec)
def _mamba2_seq(op: Mamba2Spec, d: int, n: int) -> float:
    """SSD recurrence per head with a (hd × N) state: decay (hd·N), ``dt·x Bᵀ`` update
    (2·hd·N), ``C`` readout (2·hd·N): ``5·H·hd·N``."""
    _, heads, _ = _mamba2_dims(op, d)
    return 5 * heads * op.head_dim * op.state_size


@_rule(_SEQ, ParallelSpec)
def _parallel_seq(op: ParallelSpec, d: int, n: int) -> float:
    return sum(op_seq_flops(b, d, n) for b in op.branches)


@_rule(_SEQ, SwiGLUSpec, MoESpec, NoFFNSpec)
def _ffn_seq(op: Spec, d: int, n: int) -> float:
    return 0.0


@functools.lru_cache(maxsize=65536)
def op_seq_flops(op: Spec, width: int, n: int) -> float:
    """Sequence-mixing FLOPs of one application per token, averaged over the positions of
    a causal sequence of length ``n``."""
    return _SEQ[type(op)](op, width, n)


# ---------------------------------------------------------------- inference memory per op


@_rule(_KV, AttnSpec)
def _attn_kv(op: AttnSpec, d: int, n: int) -> int:
    """K and V of ``num_kv_heads`` heads for the cached tokens: ``min(n, window)``."""
    cached = n if op.window is None else min(n, op.window)
    return 2 * (op.num_kv_heads or op.num_heads) * _head_dim(op, d) * cached


@_rule(_KV, DSASpec)
def _dsa_kv(op: DSASpec, d: int, n: int) -> int:
    """K, V and the indexer key (DI) of every token: top-k may pick any of them."""
    return (2 * (op.num_kv_heads or op.num_heads) * _head_dim(op, d) + op.index_head_dim) * n


@_rule(_KV, NSASpec)
def _nsa_kv(op: NSASpec, d: int, n: int) -> int:
    """K and V of every token: selected blocks may lie anywhere in the past (compressed
    keys are block means of these)."""
    return 2 * op.num_kv_heads * op.head_dim * n


@_rule(_KV, ParallelSpec)
def _parallel_kv(op: ParallelSpec, d: int, n: int) -> int:
    return sum(op_kv_elements(b, d, n) for b in op.branches)


@_rule(_KV, GDNSpec, KDASpec, DeltaNetSpec, Mamba2Spec, SwiGLUSpec, MoESpec, NoFFNSpec)
def _no_kv(op: Spec, d: int, n: int) -> int:
    return 0


@_rule(_STATE, GDNSpec, KDASpec)
def _gated_delta_state(op: GDNSpec | KDASpec, d: int) -> int:
    """HV matrix states (dk × dv) plus fla's conv caches, (C, W) for each of q, k, v."""
    k, v, hv, dk, dv = _delta_dims(op)
    return hv * dk * dv + ((2 * k + v) * op.conv_size if op.use_short_conv else 0)


@_rule(_STATE, DeltaNetSpec)
def _deltanet_state(op: DeltaNetSpec, d: int) -> int:
    k, v, dk, dv = _deltanet_dims(op, d)
    return op.num_heads * dk * dv + ((2 * k + v) * op.conv_size if op.use_short_conv else 0)


@_rule(_STATE, Mamba2Spec)
def _mamba2_state(op: Mamba2Spec, d: int) -> int:
    """SSM state (H, hd, N) plus the conv cache (conv_dim, W)."""
    _, heads, conv_dim = _mamba2_dims(op, d)
    return heads * op.head_dim * op.state_size + conv_dim * op.conv_kernel


@_rule(_STATE, ParallelSpec)
def _parallel_state(op: ParallelSpec, d: int) -> int:
    return sum(op_state_elements(b, d) for b in op.branches)


@_rule(_STATE, AttnSpec, DSASpec, NSASpec, SwiGLUSpec, MoESpec, NoFFNSpec)
def _no_state(op: Spec, d: int) -> int:
    return 0


@functools.lru_cache(maxsize=65536)
def op_kv_elements(op: Spec, width: int, n: int) -> int:
    """KV-cache elements one application keeps for a sequence of ``n`` tokens."""
    return _KV[type(op)](op, width, n)


@functools.lru_cache(maxsize=65536)
def op_state_elements(op: Spec, width: int) -> int:
    """Recurrent-state elements (matrix states + conv caches) of one application."""
    return _STATE[type(op)](op, width)


# ---------------------------------------------------------------- the plan, arithmetically


_CACHE: dict[tuple, tuple] = {}


def _key(op: Spec) -> tuple:
    """An op's identity as plain values: hashing it is far cheaper than pydantic's
    ``__hash__`` / ``__eq__`` on the model."""
    return type(op), tuple(op.__dict__.values())


class Counts(NamedTuple):
    """How often things run in one forward pass at a loop count.

    ``apps[f]``: applications of flat sublayer f (``2·layer + (0 mixer | 1 ffn)``), the
    product of ``T`` over the regions containing it (loops nest or are disjoint);
    ``updates[j]``: iterations after the first of region j, ``(T_j − 1)·Π T`` of the
    regions around it; ``T[j]``: region j's loop count; ``routed[f]``: applications that
    route afresh, the product of ``T`` over the regions containing f without routing replay
    (a replay region's later iterations reuse the routing of its first, as the executor
    does, and ELR's replay saves the router evaluations)."""

    apps: tuple[int, ...]
    updates: tuple[int, ...]
    T: tuple[int, ...]
    routed: tuple[int, ...]


def counts(arch: ArchSpec, loops: int | None = None) -> Counts:
    """Equals :func:`nas.plan.applications` (tested) without building the plan tree.

    Regions sorted by (start, −end) meet their enclosing regions first, so a stack of
    (end, Π T inside) gives each region the product of the loop counts around it."""
    spans = [(r.start.flat, r.end.flat) for r in arch.loops]
    ts = tuple(r.T if loops is None else loops for r in arch.loops)
    apps, routed = [1] * (2 * len(arch.layers)), [1] * (2 * len(arch.layers))
    for (a, b), t, r in zip(spans, ts, arch.loops):
        for f in range(a, b + 1):
            apps[f] *= t
            routed[f] *= 1 if r.routing_replay else t
    updates = [0] * len(spans)
    stack: list[tuple[int, int]] = []
    for j in sorted(range(len(spans)), key=lambda j: (spans[j][0], -spans[j][1])):
        a, b = spans[j]
        while stack and stack[-1][0] < a:
            stack.pop()
        outer = stack[-1][1] if stack else 1
        updates[j] = (ts[j] - 1) * outer
        stack.append((b, outer * ts[j]))
    return Counts(tuple(apps), tuple(updates), ts, tuple(routed))


def with_override(op: Spec, window, topk) -> Spec:
    """``op`` as one scheduled iteration runs it: ``window`` (``"full"`` → none) for
    attn/nsa, ``topk`` for dsa; None leaves a field alone. Cached."""
    key = ("override", _key(op), window, topk)
    out = _CACHE.get(key)
    if out is None:
        update = {}
        if window is not None and isinstance(op, (AttnSpec, NSASpec)):
            update["window"] = None if window == "full" else window
        if topk is not None and isinstance(op, DSASpec):
            update["topk"] = topk
        out = _CACHE[key] = op.model_copy(update=update) if update else op
    return out


def mixer_settings(arch: ArchSpec, layer: int, c: Counts) -> list[tuple[int, Spec]]:
    """``(applications, mixer as run)`` for one layer's mixer under loop-level schedules.

    An application inside iteration t of region j takes j's overrides for (t, layer);
    regions are applied outer to inner, so the innermost override wins (as the executor
    does). Each iteration combination of the scheduling regions covers an equal share of
    the applications; iterations beyond a schedule (elastic k > T) run the mixer as is."""
    mixer, apps = arch.layers[layer].mixer, c.apps[2 * layer]
    regs = []
    for r, t in zip(arch.loops, c.T):
        own = {o.iteration: o for o in r.schedule if o.layer == layer}
        if own and r.start.flat <= 2 * layer <= r.end.flat:
            regs.append((r.start.flat - r.end.flat, t, own))
    if not regs:
        return [(apps, mixer)]
    regs.sort(key=lambda x: x[0])
    share = apps // math.prod(t for _, t, _ in regs)
    runs: dict[tuple, int] = {}
    for combo in itertools.product(*(range(t) for _, t, _ in regs)):
        window = topk = None
        for (_, _, own), it in zip(regs, combo):
            o = own.get(it)
            if o is not None:
                window = o.window if o.window is not None else window
                topk = o.topk if o.topk is not None else topk
        runs[window, topk] = runs.get((window, topk), 0) + share
    return [(k, with_override(mixer, w, tk)) for (w, tk), k in runs.items()]


def switch_weights(arch: ArchSpec) -> tuple[float, ...] | None:
    """Probability of each switch option in a layer: a resampled pattern is a random
    permutation of ``ratio_counts(ratio, L)`` names, so option i lands in a given layer
    with probability ``count_i / L`` (options are in ratio order)."""
    rp = arch.random_placement
    if rp is None:
        return None
    n = ratio_counts(rp.ratio, len(arch.layers))
    return tuple(n[name] / len(arch.layers) for name in rp.ratio)


def layer_choices(mixer: Spec, weights: tuple[float, ...] | None) -> tuple[tuple[float, Spec], ...]:
    """``(probability, op)`` pairs a layer's mixer runs as: itself, or a switch's options."""
    if not isinstance(mixer, SwitchSpec):
        return ((1.0, mixer),)
    k = len(mixer.options)
    w = weights if weights is not None and len(weights) == k else (1 / k,) * k
    return tuple(zip(w, mixer.options))


# ---------------------------------------------------------------- the cost sheet


class OpCost(NamedTuple):
    """One sublayer; FLOPs per token summed over its applications, memory per sequence."""

    layer: int
    op: str
    kind: str
    params: int
    applications: int
    projection_flops: float
    seq_mixing_flops: float
    kv_cache_bytes: int
    state_bytes: int


class ExtraCost(NamedTuple):
    """One loop-extra parameter tensor (named as in the model) and its matmul FLOPs."""

    name: str
    params: int
    flops: float


class ProjectionFlops(NamedTuple):
    """Projection compute per token: Σ applications · C_A, Σ applications · C_F, C_H."""

    mixer: float
    ffn: float
    head: float

    @property
    def total(self) -> float:
        return self.mixer + self.ffn + self.head


class Figures(NamedTuple):
    """Everything that depends on the loop count (``loops=None``: each region's own T)."""

    loops: int | None
    projection: ProjectionFlops
    loop_extra_flops: float
    seq_mixing_flops: float
    kv_cache_bytes: int
    state_bytes: int
    ops: tuple[OpCost, ...]
    extras: tuple[ExtraCost, ...]

    @property
    def forward_flops(self) -> float:
        """Projection + loop extras + sequence mixing, per token of one forward pass."""
        return self.projection.total + self.loop_extra_flops + self.seq_mixing_flops


def _extras(arch: ArchSpec, c: Counts) -> tuple[ExtraCost, ...]:
    """Loop-extra parameters (m = :func:`max_loops`) and their matmul FLOPs per token.

    ρ (m, d): one ``rho`` for all regions with a shared residual gate, else one per region;
    gated step ``gate`` Linear(2d, d) + bias, run from the second iteration on:
    ``2·(2d² + d)`` per update; concat re-injection Linear(2d, d): ``2·2d²`` per update;
    diagonal re-injection two (d) vectors; conditioning tables (m, d): ``index_emb``, and
    ``budget_emb`` for ``index_budget``. Elementwise ones cost no FLOPs."""
    d, m = arch.model.width, max_loops(arch)
    out = []
    if any(r.update.kind == "residual_gate" and r.update.shared for r in arch.loops):
        out.append(ExtraCost("rho", m * d, 0.0))
    for j, (r, ups) in enumerate(zip(arch.loops, c.updates)):
        u, p = r.update, f"loops.{j}."
        if u.kind == "residual_gate" and not u.shared:
            out.append(ExtraCost(p + "rho", m * d, 0.0))
        elif u.kind == "gated_step":
            out.append(ExtraCost(p + "gate", 2 * d * d + d, 2.0 * (2 * d * d + d) * ups))
        elif u.kind == "reinject" and u.mode == "concat":
            out.append(ExtraCost(p + "reinject", 2 * d * d, 4.0 * d * d * ups))
        elif u.kind == "reinject" and u.mode == "diagonal":
            out += [ExtraCost(p + "reinject_a", d, 0.0), ExtraCost(p + "reinject_b", d, 0.0)]
        if r.conditioning != "none":
            out.append(ExtraCost(p + "index_emb", m * d, 0.0))
        if r.conditioning == "index_budget":
            out.append(ExtraCost(p + "budget_emb", m * d, 0.0))
    return tuple(out)


class _Static(NamedTuple):
    params: int
    active: int
    state: int


class _Profile(NamedTuple):
    params: int
    active: int
    state: int
    seq: float
    kv: int


def _static(op: Spec, d: int) -> _Static:
    """Parameters, active parameters and state elements of one op, cached."""
    key = (_key(op), d)
    s = _CACHE.get(key)
    if s is None:
        if len(_CACHE) >= 1 << 16:
            _CACHE.clear()
        if isinstance(op, SwitchSpec):  # priced per option, see layer_choices
            s = _CACHE[key] = _Static(op_params(op, d), 0, 0)
        else:
            s = _CACHE[key] = _Static(op_params(op, d), op_active_params(op, d), op_state_elements(op, d))
    return s


def _profile(op: Spec, d: int, n: int) -> _Profile:
    """:func:`_static` plus the context-dependent sequence FLOPs and KV elements, cached."""
    key = (_key(op), d, n)
    p = _CACHE.get(key)
    if p is None:
        if len(_CACHE) >= 1 << 16:
            _CACHE.clear()
        p = _CACHE[key] = _Profile(*_static(op, d), op_seq_flops(op, d, n), op_kv_elements(op, d, n))
    return p


def _scheduled(arch: ArchSpec) -> frozenset[int]:
    return frozenset(o.layer for r in arch.loops for o in r.schedule)


def _layer_profiles(arch: ArchSpec, n: int) -> list[tuple[_Profile | None, _Profile]]:
    """(mixer, ffn) profiles per layer; None where the mixer is priced per application
    setting (a loop-level schedule or a switch), see :func:`_general_mixer_row`."""
    d, scheduled = arch.model.width, _scheduled(arch)
    return [(None if i in scheduled or isinstance(l.mixer, SwitchSpec) else _profile(l.mixer, d, n),
             _profile(l.ffn, d, n)) for i, l in enumerate(arch.layers)]


def _general_mixer_row(arch: ArchSpec, i: int, c: Counts, n: int, nbytes: int, weights) -> OpCost:
    """A mixer whose applications differ (schedule overrides) or that is a switch.

    KV: ``per_loop`` keeps a cache per application, ``last_loop`` one per layer sized for
    the widest window it runs with; recurrent state is per application (each application
    reads its own input sequence, as ELR keeps per-loop state)."""
    d, mixer = arch.model.width, arch.layers[i].mixer
    proj = seq = 0.0
    kv_apps = kv_max = state = 0
    for share, op in mixer_settings(arch, i, c):
        profiles = [(w, _profile(ch, d, n)) for w, ch in layer_choices(op, weights)]
        proj += share * sum(w * 2 * p.active for w, p in profiles)
        seq += share * sum(w * p.seq for w, p in profiles)
        kv = max(p.kv for _, p in profiles)
        kv_apps, kv_max = kv_apps + share * kv, max(kv_max, kv)
        state += share * max(p.state for _, p in profiles)
    kv = kv_max if arch.kv_policy == "last_loop" else kv_apps
    return OpCost(i, "mixer", mixer.kind, _static(mixer, d).params, c.apps[2 * i], proj, seq,
                  kv * nbytes, state * nbytes)


def _ffn_flops(op: Spec, d: int, c: Counts, layer: int, active: int) -> float:
    """Σ applications · C_F of one FFN, less the router (d × E) in the applications that
    replay a routing instead of routing afresh."""
    f = 2 * layer + 1
    router = d * op.num_experts if isinstance(op, MoESpec) else 0
    return 2.0 * (c.apps[f] * active - (c.apps[f] - c.routed[f]) * router)


def _figures(arch: ArchSpec, loops: int | None, n: int, nbytes: int, weights,
             profiles: list[tuple[_Profile | None, _Profile]]) -> Figures:
    """One pass over the layers at a loop count; same KV/state rules as
    :func:`_general_mixer_row`, with every application of a mixer alike."""
    c, layers = counts(arch, loops), arch.layers
    kv_runs = arch.kv_policy != "last_loop"
    rows: list[OpCost] = []
    mixer = ffn = seq = 0.0
    kv = state = 0
    for i, (mp, fp) in enumerate(profiles):
        apps = c.apps[2 * i]
        if mp is None:
            row = _general_mixer_row(arch, i, c, n, nbytes, weights)
        else:
            row = OpCost(i, "mixer", layers[i].mixer.kind, mp.params, apps, 2.0 * apps * mp.active,
                         apps * mp.seq, mp.kv * (apps if kv_runs else 1) * nbytes, apps * mp.state * nbytes)
        mixer, seq = mixer + row.projection_flops, seq + row.seq_mixing_flops
        kv, state = kv + row.kv_cache_bytes, state + row.state_bytes
        apps = c.apps[2 * i + 1]
        rows += (row, OpCost(i, "ffn", layers[i].ffn.kind, fp.params, apps,
                             _ffn_flops(layers[i].ffn, arch.model.width, c, i, fp.active), 0.0, 0, 0))
        ffn += rows[-1].projection_flops
    extras = _extras(arch, c)
    return Figures(loops, ProjectionFlops(mixer, ffn, 2.0 * arch.model.vocab_size * arch.model.width),
                   sum(e.flops for e in extras), seq, kv, state, tuple(rows), extras)


def projection_flops(arch: ArchSpec, loops: int | None = None) -> ProjectionFlops:
    """Projection compute per token (MixerLoop §3.3) at a loop count; see module docstring."""
    d, c, weights, scheduled = arch.model.width, counts(arch, loops), switch_weights(arch), _scheduled(arch)
    mixer = ffn = 0.0
    for i, layer in enumerate(arch.layers):
        if i in scheduled or isinstance(layer.mixer, SwitchSpec):
            for share, op in mixer_settings(arch, i, c):
                mixer += share * sum(w * 2 * _static(ch, d).active for w, ch in layer_choices(op, weights))
        else:
            mixer += 2 * c.apps[2 * i] * _static(layer.mixer, d).active
        ffn += _ffn_flops(layer.ffn, d, c, i, _static(layer.ffn, d).active)
    return ProjectionFlops(mixer, ffn, 2.0 * arch.model.vocab_size * d)


def norm_params(arch: ArchSpec) -> int:
    """``mixer_norm`` and ``ffn_norm`` per layer (no ``ffn_norm`` without an FFN) and the
    final ``norm``: d each, 2d for layernorm (weight + bias)."""
    size = arch.model.width * (2 if arch.model.norm.kind == "layernorm" else 1)
    return size * (1 + sum(2 - isinstance(l.ffn, NoFFNSpec) for l in arch.layers))


def embedding_params(arch: ArchSpec) -> int:
    """``embed`` (V, d), plus ``lm_head`` (V, d) when embeddings are untied."""
    return arch.model.vocab_size * arch.model.width * (1 if arch.model.tie_embeddings else 2)


def unique_params(arch: ArchSpec) -> int:
    """Every parameter of the compiled model, each shared tensor once."""
    d = arch.model.width
    ops = sum(_static(l.mixer, d).params + _static(l.ffn, d).params for l in arch.layers)
    extras = sum(e.params for e in _extras(arch, counts(arch)))
    return embedding_params(arch) + norm_params(arch) + ops + extras


@dataclass(frozen=True)
class CostSheet:
    """The priced spec. ``figures``: at each region's own T; ``per_k``: one per elastic
    evaluation loop count. Memory is per sequence of ``seq_len`` tokens at ``dtype``."""

    name: str
    seq_len: int
    dtype: str
    tokens: int | None
    unique_params: int
    embedding_params: int
    norm_params: int
    figures: Figures
    per_k: tuple[Figures, ...]
    train_flops_per_token: float

    @property
    def non_embedding_params(self) -> int:
        """Unique parameters less ``embed`` and (untied) ``lm_head``."""
        return self.unique_params - self.embedding_params

    @property
    def projection_flops_per_token(self) -> float:
        return self.figures.projection.total

    @property
    def train_flops(self) -> float | None:
        """Training FLOPs of a run of ``tokens`` tokens."""
        return None if self.tokens is None else self.train_flops_per_token * self.tokens

    def at(self, k: int) -> Figures:
        """The figures of elastic evaluation loop count ``k``."""
        for f in self.per_k:
            if f.loops == k:
                return f
        raise KeyError(f"no figures for k={k}; evaluated loop counts: {[f.loops for f in self.per_k]}")

    def to_dict(self) -> dict:
        out = {"name": self.name, "seq_len": self.seq_len, "dtype": self.dtype,
               "tokens": self.tokens, "unique_params": self.unique_params,
               "non_embedding_params": self.non_embedding_params,
               "embedding_params": self.embedding_params, "norm_params": self.norm_params,
               **_figures_dict(self.figures),
               "train_flops_per_token": _num(self.train_flops_per_token),
               "train_flops": None if self.train_flops is None else _num(self.train_flops)}
        if self.per_k:
            out["per_k"] = {str(f.loops): _figures_dict(f) for f in self.per_k}
        out["ops"] = [{k: _num(v) for k, v in r._asdict().items()} for r in self.figures.ops]
        out["extras"] = [{k: _num(v) for k, v in e._asdict().items()} for e in self.figures.extras]
        return out


def _num(x):
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _figures_dict(f: Figures) -> dict:
    p = f.projection
    return {"projection_flops_per_token": _num(p.total),
            "projection_flops_breakdown": {"mixer": _num(p.mixer), "ffn": _num(p.ffn), "head": _num(p.head)},
            "loop_extra_flops_per_token": _num(f.loop_extra_flops),
            "seq_mixing_flops_per_token": _num(f.seq_mixing_flops),
            "forward_flops_per_token": _num(f.forward_flops),
            "kv_cache_bytes": f.kv_cache_bytes, "state_bytes": f.state_bytes}


def _train_forward(arch: ArchSpec, fig) -> float:
    """Forward FLOPs per training token. Without elastic depth: at each region's T. With
    it: 1 loop before ``switch_at`` (ELR switches a trained 1-loop model to mixed depth),
    then the ``train`` distribution's expectation."""
    if arch.elastic is None:
        return fig(None).forward_flops
    dist = arch.elastic.train
    mixed = sum(w * fig(k).forward_flops for k, w in zip(dist.values, dist.weights)) / sum(dist.weights)
    s = arch.elastic.switch_at
    return s * fig(1).forward_flops + (1 - s) * mixed if s else mixed


def cost(arch: ArchSpec, seq_len: int = DEFAULT_SEQ_LEN, dtype: str = "bf16",
         tokens: int | None = None) -> CostSheet:
    """Price a canonical spec. Training FLOPs per token are 3 × forward (the backward pass
    costs twice the forward: gradients with respect to activations and to weights)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    nbytes, weights = DTYPE_BYTES[dtype], switch_weights(arch)
    profiles = _layer_profiles(arch, seq_len)
    by_t: dict[tuple[int, ...], Figures] = {}

    def fig(k: int | None) -> Figures:
        ts = tuple(r.T if k is None else k for r in arch.loops)
        if ts not in by_t:
            by_t[ts] = _figures(arch, k, seq_len, nbytes, weights, profiles)
        return by_t[ts]._replace(loops=k)

    main = fig(None)
    per_k = tuple(fig(k) for k in arch.elastic.eval) if arch.elastic is not None else ()
    params = (embedding_params(arch) + norm_params(arch) + sum(r.params for r in main.ops)
              + sum(e.params for e in main.extras))
    return CostSheet(arch.name, seq_len, dtype, tokens, params, embedding_params(arch),
                     norm_params(arch), main, per_k, 3 * _train_forward(arch, fig))


__all__ = [
    "CostSheet", "Counts", "ExtraCost", "Figures", "OpCost", "ProjectionFlops",
    "DEFAULT_SEQ_LEN", "DTYPE_BYTES", "cost", "counts", "embedding_params", "layer_choices",
    "mean_blocks", "mean_keys", "mixer_settings", "moe_params", "norm_params",
    "op_active_params", "op_kv_elements", "op_params", "op_projection_flops",
    "op_seq_flops", "op_state_elements", "projection_flops", "switch_weights",
    "unique_params", "with_override",
]
