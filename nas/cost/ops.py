"""Per-op cost rules: parameters, projection compute, sequence-mixing FLOPs, KV-cache and
recurrent-state elements of one op (mixer or FFN spec) at a model width. One rule per spec
type in each table, registered once; the conventions are in the :mod:`nas.cost` docstring."""
from __future__ import annotations

import functools
from typing import Callable

from ..registry import register_once
from ..spec import (
    AttnSpec, DeltaNetSpec, DSASpec, GDNSpec, KDASpec, Mamba2Spec, MoESpec, NoFFNSpec,
    NormSpec, NSASpec, ParallelSpec, Spec, SwiGLUSpec, SwitchSpec,
)

_PARAMS: dict[type, Callable[[Spec, int], int]] = {}
_SEQ: dict[type, Callable[[Spec, int, int], float]] = {}
_KV: dict[type, Callable[[Spec, int, int], int]] = {}
_STATE: dict[type, Callable[[Spec, int], tuple[int, int]]] = {}


def _rule(table: dict, *types: type) -> Callable:
    """Register ``fn`` as ``table``'s rule for each spec type (once)."""
    return register_once(table, *types, what="a cost rule for")


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


def _qk_norm_params(op: AttnSpec | DSASpec, hd: int, q: int, kv: int) -> int:
    """q_norm and k_norm: hd each per head (``qk_norm_over: head``), or q = H·hd and
    kv = Hkv·hd over the whole projections (``heads``); twice that for a layernorm
    (weight + bias). Partial rotary adds no parameters."""
    if op.qk_norm is False:
        return 0
    per = 2 if isinstance(op.qk_norm, NormSpec) and op.qk_norm.kind == "layernorm" else 1
    return per * (q + kv if getattr(op, "qk_norm_over", "head") == "heads" else 2 * hd)


def _attn_core_params(op: AttnSpec | DSASpec, d: int) -> int:
    """q (d→H·hd), k, v (d→Hkv·hd), biases when ``qkv_bias``, o (H·hd→d, no bias),
    q_norm/k_norm when ``qk_norm`` (:func:`_qk_norm_params`), g_proj (d→H·hd, no bias)
    when ``output_gate``. With hd = d/H this is fla ``Attention`` exactly (which has no gate)."""
    hd = _head_dim(op, d)
    q, kv = op.num_heads * hd, (op.num_kv_heads or op.num_heads) * hd
    bias = q + 2 * kv if op.qkv_bias else 0
    return (2 * d * q + 2 * d * kv + bias + _qk_norm_params(op, hd, q, kv)
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


def _combine_params(op: ParallelSpec, d: int) -> int:
    """What a parallel mixer adds around its n branches: ``norms.{i}`` (d each, 2d for
    layernorm) with ``branch_norm``, ``scale`` (n, d) with ``branch_scale``, and ``proj``
    (n·d → d, no bias) for a ``concat`` combine. The norms and scales are elementwise
    parameters of the mixer, so projection compute charges them 2 FLOPs each, like the
    branches' own output norms."""
    n = len(op.branches)
    if op.branch_norm is True:
        raise ValueError("branch_norm: true is the model's norm; price the lowered spec")
    norm = n * d * (2 if op.branch_norm.kind == "layernorm" else 1) if isinstance(op.branch_norm, NormSpec) else 0
    return norm + (n * d if op.branch_scale else 0) + (n * d * d if op.combine == "concat" else 0)


@_rule(_PARAMS, ParallelSpec)
def _parallel_params(op: ParallelSpec, d: int) -> int:
    """Sum of the branches plus :func:`_combine_params`."""
    return sum(op_params(b, d) for b in op.branches) + _combine_params(op, d)


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
    (all E when None), the shared SwiGLU expert of ``shared_expert_hidden`` (if > 0) and
    its ``shared_expert_gate`` (d→1, no bias)."""
    n = op.num_experts if experts is None else experts
    gate = d if op.shared_expert_gate else 0
    return d * op.num_experts + 3 * d * (n * op.expert_hidden + op.shared_expert_hidden) + gate


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
    shared expert) and parallel mixers (the sum over branches of theirs, plus what combines
    them: :func:`_combine_params`)."""
    if isinstance(op, MoESpec):
        return moe_params(op, width, op.top_k)
    if isinstance(op, ParallelSpec):
        return sum(op_active_params(b, width) for b in op.branches) + _combine_params(op, width)
    if isinstance(op, SwitchSpec):
        raise ValueError("a switch runs one option; price its options (see layer_choices)")
    return op_params(op, width)


def op_projection_flops(op: Spec, width: int) -> int:
    """``C_A`` or ``C_F`` of one op: 2 × its active parameters (one application, per token)."""
    return 2 * op_active_params(op, width)


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


# Inference memory is what ``LoopLM.prefill`` keeps per sequence after ``n`` tokens
# (``builders.inference.InferenceCache.nbytes``, tested equal): KV caches in the model's
# dtype; recurrent matrix states in float32 at least (the precision the chunked forward
# carries them in, and fla's kernels return them in); short-conv tails in the model's dtype.


@_rule(_KV, AttnSpec)
def _attn_kv(op: AttnSpec, d: int, n: int) -> int:
    """K and V (after rotary) of ``num_kv_heads`` heads for the cached tokens,
    ``min(n, window)``: a windowed cache drops the keys no later query can see."""
    cached = n if op.window is None else min(n, op.window)
    return 2 * (op.num_kv_heads or op.num_heads) * _head_dim(op, d) * cached


@_rule(_KV, DSASpec)
def _dsa_kv(op: DSASpec, d: int, n: int) -> int:
    """K, V and the indexer key (DI) of every token: top-k may pick any of them."""
    return (2 * (op.num_kv_heads or op.num_heads) * _head_dim(op, d) + op.index_head_dim) * n


@_rule(_KV, NSASpec)
def _nsa_kv(op: NSASpec, d: int, n: int) -> int:
    """K and V of every token (selected blocks may lie anywhere in the past) plus the
    compressed K and V, one mean per completed block: ``2·Hkv·hd·(n + ⌊n/b⌋)``."""
    return 2 * op.num_kv_heads * op.head_dim * (n + n // op.block_size)


@_rule(_KV, ParallelSpec)
def _parallel_kv(op: ParallelSpec, d: int, n: int) -> int:
    return sum(op_kv_elements(b, d, n) for b in op.branches)


@_rule(_KV, GDNSpec, KDASpec, DeltaNetSpec, Mamba2Spec, SwiGLUSpec, MoESpec, NoFFNSpec)
def _no_kv(op: Spec, d: int, n: int) -> int:
    return 0


# State rules return (recurrent matrix elements, short-conv elements). A conv tail keeps
# the last W inputs of each channel, fla's ``conv_state`` (B, C, W) (W − 1 are read).


@_rule(_STATE, GDNSpec, KDASpec)
def _gated_delta_state(op: GDNSpec | KDASpec, d: int) -> tuple[int, int]:
    """HV matrix states (dk × dv), and the q, k, v conv tails, (C, W) each."""
    k, v, hv, dk, dv = _delta_dims(op)
    return hv * dk * dv, (2 * k + v) * op.conv_size if op.use_short_conv else 0


@_rule(_STATE, DeltaNetSpec)
def _deltanet_state(op: DeltaNetSpec, d: int) -> tuple[int, int]:
    """H matrix states (dk × dv), and the q, k, v conv tails."""
    k, v, dk, dv = _deltanet_dims(op, d)
    return op.num_heads * dk * dv, (2 * k + v) * op.conv_size if op.use_short_conv else 0


@_rule(_STATE, Mamba2Spec)
def _mamba2_state(op: Mamba2Spec, d: int) -> tuple[int, int]:
    """SSM state (H, hd, N), and the conv tail (conv_dim, W)."""
    _, heads, conv_dim = _mamba2_dims(op, d)
    return heads * op.head_dim * op.state_size, conv_dim * op.conv_kernel


@_rule(_STATE, ParallelSpec)
def _parallel_state(op: ParallelSpec, d: int) -> tuple[int, int]:
    parts = [_STATE[type(b)](b, d) for b in op.branches]
    return sum(r for r, _ in parts), sum(c for _, c in parts)


@_rule(_STATE, AttnSpec, DSASpec, NSASpec, SwiGLUSpec, MoESpec, NoFFNSpec)
def _no_state(op: Spec, d: int) -> tuple[int, int]:
    return 0, 0


@functools.lru_cache(maxsize=65536)
def op_kv_elements(op: Spec, width: int, n: int) -> int:
    """KV-cache elements one application keeps for a sequence of ``n`` tokens."""
    return _KV[type(op)](op, width, n)


@functools.lru_cache(maxsize=65536)
def op_state_elements(op: Spec, width: int) -> int:
    """Recurrent-state elements (matrix states + conv tails) of one application."""
    return sum(_STATE[type(op)](op, width))


@functools.lru_cache(maxsize=65536)
def op_state_bytes(op: Spec, width: int, nbytes: int) -> int:
    """Recurrent-state bytes of one application in a model of ``nbytes`` per element: the
    matrix states in float32 at least (``max(nbytes, 4)``), the conv tails at ``nbytes``."""
    recurrent, conv = _STATE[type(op)](op, width)
    return recurrent * max(nbytes, 4) + conv * nbytes
