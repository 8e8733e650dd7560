"""Torch linear mixers vs fla's layers: parameters, initialisation, and forward/backward math.

References are rebuilt from the fla layer (``make_fla``) holding the torch twin's weights:
its convs run as plain ``nn.Conv1d`` and its recurrence as a token loop. Two flavours:

* exact, float64: token recurrences from ``builders.ops.linear`` and fla's gate formulas
  transcribed; agreement to 1e-9.
* fla, float32: fla's own naive recurrences and gate functions (which compute in float32
  whatever the input); agreement to 2e-4.

Mamba2 is also checked against fla's own CPU path (``torch_forward``) through ``make_fla``.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from builders.layers.linear_mixers import TORCH_LAYERS, make_fla
from builders.ops.linear import recurrent_delta_rule_ref, recurrent_gated_delta_rule_ref, recurrent_kda_ref
from builders.ops.linear import recurrent_ssd_ref

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.modules.norm.layernorm import rms_norm_ref
    from fla.modules.norm.layernorm_gated import rms_norm_ref as gated_rms_norm_ref
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
    from fla.ops.kda.naive import naive_recurrent_kda


pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:ShortConvolution is crucial")]

F64 = dict(atol=1e-9, rtol=1e-9)
F32 = dict(atol=2e-4, rtol=2e-4)

CONFIGS = {
    "gdn": [
        dict(hidden_size=64, head_dim=16, num_heads=4),
        dict(hidden_size=32, head_dim=8, num_heads=2, num_v_heads=4, expand_v=1, use_gate=False, use_short_conv=False,
             allow_neg_eigval=True),
        dict(hidden_size=32, head_dim=8, num_heads=2, conv_bias=True, output_gate_activation="sigmoid", conv_size=2),
    ],
    "deltanet": [
        dict(hidden_size=64, num_heads=4),
        dict(hidden_size=32, num_heads=2, expand_v=2, use_gate=True, use_beta=False, conv_bias=True,
             qk_activation="elu", qk_norm="sum"),
        dict(hidden_size=32, num_heads=2, expand_k=0.5, use_short_conv=False, qk_activation="relu",
             allow_neg_eigval=True),
    ],
    "kda": [
        dict(hidden_size=64, head_dim=16, num_heads=4),
        dict(hidden_size=32, head_dim=8, num_heads=2, num_v_heads=4, expand_v=2, safe_gate=True, lower_bound=-5.0,
             use_short_conv=False, allow_neg_eigval=True),
    ],
    "mamba2": [
        dict(hidden_size=32, head_dim=8, state_size=8, chunk_size=16),
        dict(hidden_size=32, head_dim=16, state_size=4, n_groups=2, D_has_hdim=True, norm_before_gate=True,
             use_bias=True, chunk_size=32, conv_init=0.5),
        dict(hidden_size=16, head_dim=8, state_size=4, expand=1, rmsnorm=False, dt_limit=(0.01, 0.5), chunk_size=8),
    ],
}
CASES = [pytest.param(kind, i, id=f"{kind}-cfg{i}") for kind, cfgs in CONFIGS.items() for i in range(len(cfgs))]
DELTA_CASES = [case for case in CASES if case.values[0] != "mamba2"]  # fla has no naive SSD op
SHAPES = [(2, 63), (1, 1), (1, 40)]
SHAPE_IDS = [f"B{b}-T{t}" for b, t in SHAPES]


def _build(kind, cfg, dtype):
    """The torch twin (seeded, constant-initialised params perturbed) and fla's layer with its weights."""
    torch.manual_seed(0)
    layer = TORCH_LAYERS[kind](**cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))  # float32 values: fla's refs may cast weights to float32 losslessly
    fla = make_fla(kind, **cfg)
    fla.load_state_dict(layer.state_dict(), strict=True)
    return layer.to(dtype), fla.to(dtype)


def _l2(x):
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)


def _conv(conv, x):
    """fla's ShortConvolution math via its nn.Conv1d base: pad W-1 both sides, keep the first T outputs."""
    y = nn.Conv1d.forward(conv, x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
    return F.silu(y) if conv.activation else y


def _qkv(layer, x, qk_silu=True):
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    if layer.use_short_conv:
        q, k, v = _conv(layer.q_conv1d, q), _conv(layer.k_conv1d, k), _conv(layer.v_conv1d, v)
    else:
        q, k, v = (F.silu(q), F.silu(k), F.silu(v)) if qk_silu else (q, k, F.silu(v))
    heads = (lambda t, d: t.unflatten(-1, (-1, d)))
    return heads(q, layer.head_k_dim), heads(k, layer.head_k_dim), heads(v, layer.head_v_dim)


def _expand_heads(q, k, HV):
    return q.repeat_interleave(HV // q.shape[2], 2), k.repeat_interleave(HV // k.shape[2], 2)


def _gated_norm(x, z, w, eps, act=F.silu, group_size=None, norm_before_gate=True):
    """fla's gated norm kernels, transcribed: fla's ``rms_norm_ref`` casts the weight (and its grad) to float32."""
    if not norm_before_gate:
        x = x * act(z)
    xg = x.unflatten(-1, (-1, group_size or x.shape[-1]))
    y = (xg / torch.sqrt(xg.square().mean(-1, keepdim=True) + eps)).flatten(-2) * w
    return y * act(z) if norm_before_gate else y


def _out(layer, o, x, activation="swish"):
    if hasattr(layer, "g_proj"):
        act = torch.sigmoid if activation == "sigmoid" else F.silu
        g = layer.g_proj(x).unflatten(-1, (-1, layer.head_v_dim))
        o = _gated_norm(o, g, layer.o_norm.weight, layer.o_norm.eps, act)
    else:
        o = rms_norm_ref(o, layer.o_norm.weight, None, eps=layer.o_norm.eps)
    return layer.o_proj(o.flatten(-2))


def _kda_gate(f, A_log, dt_bias, lower_bound=None):
    """fla's KDA gates (fla/ops/kda/gate.py) transcribed, in the input dtype."""
    f = f + dt_bias.view(f.shape[-2:])
    A = A_log.exp()[:, None]  # (HV, 1)
    return -A * F.softplus(f) if lower_bound is None else lower_bound * torch.sigmoid(A * f)


def _fla_kda_gate(f, A_log, dt_bias, lower_bound=None):
    if lower_bound is None:
        return naive_kda_gate(f, A_log, dt_bias)
    return naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=lower_bound)


EXACT = types.SimpleNamespace(
    gdn=lambda q, k, v, g, beta: recurrent_gated_delta_rule_ref(q, k, v, g, beta)[0],
    delta=lambda q, k, v, beta: recurrent_delta_rule_ref(q, k, v, beta)[0],
    kda=lambda q, k, v, g, beta: recurrent_kda_ref(q, k, v, g, beta)[0],
    gdn_gate=lambda a, A_log, dt_bias: -A_log.exp() * F.softplus(a + dt_bias),
    kda_gate=_kda_gate,
)


def _fla_delta(q, k, v, beta):
    o, _ = delta_rule_recurrence(*(t.transpose(1, 2) for t in (q, k, v, beta)))
    return o.transpose(1, 2)


FLA = types.SimpleNamespace(
    gdn=lambda q, k, v, g, beta: naive_recurrent_gated_delta_rule(q, k, v, beta, g)[0],
    delta=_fla_delta,
    kda=lambda q, k, v, g, beta: naive_recurrent_kda(q, k, v, g, beta)[0],
    gdn_gate=naive_gdn_gate,
    kda_gate=_fla_kda_gate,
)


def gdn_ref(layer, x, ops):
    q, k, v = _qkv(layer, x)
    q, k = _expand_heads(_l2(q), _l2(k), layer.num_v_heads)
    beta = layer.b_proj(x).sigmoid() * (2.0 if layer.allow_neg_eigval else 1.0)
    g = ops.gdn_gate(layer.a_proj(x), layer.A_log, layer.dt_bias)
    o = ops.gdn(q, k, v, g.to(x.dtype), beta)
    return _out(layer, o, x, layer.o_norm.activation if layer.use_gate else None)


def deltanet_ref(layer, x, ops):
    q, k, v = _qkv(layer, x, qk_silu=layer.qk_activation == "silu")
    if layer.qk_activation == "relu":
        q, k = q.relu(), k.relu()
    elif layer.qk_activation == "elu":
        q, k = F.elu(q) + 1, F.elu(k) + 1
    if layer.qk_norm == "sum":
        q, k = F.normalize(q, p=1, dim=-1, eps=1e-6), F.normalize(k, p=1, dim=-1, eps=1e-6)
    else:
        q, k = _l2(q), _l2(k)
    beta = layer.b_proj(x).sigmoid() if layer.use_beta else torch.ones_like(q[..., 0])
    beta = beta * 2.0 if layer.allow_neg_eigval else beta
    return _out(layer, ops.delta(q, k, v, beta), x)


def kda_ref(layer, x, ops):
    q, k, v = _qkv(layer, x)
    q, k = _expand_heads(_l2(q), _l2(k), layer.num_v_heads)
    f = layer.f_proj(x).unflatten(-1, (-1, layer.head_k_dim))
    g = ops.kda_gate(f, layer.A_log, layer.dt_bias, layer.lower_bound)
    beta = layer.b_proj(x).sigmoid() * (2.0 if layer.allow_neg_eigval else 1.0)
    return _out(layer, ops.kda(q, k, v, g.to(x.dtype), beta), x, "sigmoid")


def mamba2_ref(layer, x, ops):
    """Mamba2.torch_forward's prefill math, with the SSD as a token loop (``ops`` unused: no fla naive SSD)."""
    I, H, G, N, P = layer.intermediate_size, layer.num_heads, layer.n_groups, layer.ssm_state_size, layer.head_dim
    gate, xBC, dt = layer.in_proj(x).split([I, layer.conv_dim, H], dim=-1)
    xBC = F.silu(layer.conv1d(xBC.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2))
    xs, B, C = xBC.split([I, G * N, G * N], dim=-1)
    B, C = (t.reshape(*t.shape[:2], G, N).repeat(1, 1, H // G, 1) for t in (B, C))
    dt = torch.clamp(F.softplus(dt + layer.dt_bias), *layer.dt_limit)
    D = layer._get_D(expand_to_head_dim=True)
    y, _ = recurrent_ssd_ref(xs.reshape(*xs.shape[:2], H, P), dt, -torch.exp(layer.A_log), B, C, D)
    y = y.flatten(-2)
    if layer.rmsnorm:
        norm = layer.norm
        y = _gated_norm(y, gate, norm.weight, norm.eps, F.silu, norm.group_size, layer.norm_before_gate)
    else:
        y = y * F.silu(gate)
    return layer.out_proj(y)


REFS = {"gdn": gdn_ref, "deltanet": deltanet_ref, "kda": kda_ref, "mamba2": mamba2_ref}


def _outputs_and_grads(module, fn, x):
    y = fn(x)
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype)
    names, params = zip(*module.named_parameters())
    grads = torch.autograd.grad((y * dy).sum(), (x, *params))
    return y, dict(zip(("x", *names), grads))


def _check(kind, i, B, T, dtype, ops, tol):
    layer, fla = _build(kind, CONFIGS[kind][i], dtype)
    x = torch.randn(B, T, layer.hidden_size, dtype=dtype, requires_grad=True)
    y, grads = _outputs_and_grads(layer, layer, x)
    y_ref, grads_ref = _outputs_and_grads(fla, lambda t: REFS[kind](fla, t, ops), x)
    torch.testing.assert_close(y, y_ref, **tol)
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], **tol, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("B,T", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("kind,i", CASES)
def test_forward_and_grads_match_fla_math_f64(kind, i, B, T):
    _check(kind, i, B, T, torch.float64, EXACT, F64)


@pytest.mark.parametrize("kind,i", DELTA_CASES)
def test_forward_and_grads_match_fla_naive_ops_f32(kind, i):
    _check(kind, i, 2, 63, torch.float32, FLA, F32)


def _cpu_runnable(fla_mamba2):
    """fla's Mamba2 falls back to torch_forward off CUDA; only its SiLU and gated norm need Triton."""
    norm = fla_mamba2.norm
    fla_mamba2.act = F.silu
    if norm is not None:
        norm.forward = lambda x, z: gated_rms_norm_ref(
            x, norm.weight, None, z=z, eps=norm.eps, group_size=norm.group_size, norm_before_gate=norm.norm_before_gate,
            upcast=False,
        )
    return fla_mamba2


@pytest.mark.parametrize("B,T", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("i", range(len(CONFIGS["mamba2"])), ids=lambda i: f"cfg{i}")
def test_mamba2_matches_fla_torch_forward(i, B, T):
    """torch_forward casts x, B, C to float32 internally, so even in float64 it agrees only to ~1e-6."""
    layer, fla = _build("mamba2", CONFIGS["mamba2"][i], torch.float64)
    fla = _cpu_runnable(fla)
    x = torch.randn(B, T, layer.hidden_size, dtype=torch.float64, requires_grad=True)
    y, grads = _outputs_and_grads(layer, layer, x)
    y_fla, grads_fla = _outputs_and_grads(fla, fla, x)
    assert isinstance(y_fla, torch.Tensor)
    torch.testing.assert_close(y, y_fla, atol=1e-5, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_fla[name], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind,i", CASES)
def test_parameters_and_init_match_fla(kind, i):
    cfg = CONFIGS[kind][i]
    torch.manual_seed(0)
    layer = TORCH_LAYERS[kind](**cfg)
    torch.manual_seed(0)
    fla = make_fla(kind, **cfg)
    ours = [(n, p.shape, p.dtype) for n, p in layer.named_parameters()]
    theirs = [(n, p.shape, p.dtype) for n, p in fla.named_parameters()]
    assert ours == theirs
    for (name, p), (_, q) in zip(layer.named_parameters(), fla.named_parameters()):
        assert torch.equal(p, q), name
        assert getattr(p, "_no_weight_decay", False) == getattr(q, "_no_weight_decay", False), name


@pytest.mark.parametrize("kind,i", CASES)
def test_state_dicts_load_both_ways_strictly(kind, i):
    cfg = CONFIGS[kind][i]
    torch.manual_seed(0)
    layer = TORCH_LAYERS[kind](**cfg)
    torch.manual_seed(1)
    fla = make_fla(kind, **cfg)
    fla.load_state_dict(layer.state_dict(), strict=True)
    assert all(torch.equal(p, q) for p, q in zip(layer.state_dict().values(), fla.state_dict().values()))
    torch.manual_seed(2)
    twin = TORCH_LAYERS[kind](**cfg)
    twin.load_state_dict(fla.state_dict(), strict=True)
    assert all(torch.equal(p, q) for p, q in zip(twin.state_dict().values(), layer.state_dict().values()))


def test_make_fla_subclasses_fla_and_rejects_unknown_kinds():
    from fla.layers import GatedDeltaNet

    assert isinstance(make_fla("gdn", hidden_size=32, head_dim=8, num_heads=2), GatedDeltaNet)
    with pytest.raises(ValueError, match="gla"):
        make_fla("gla")


def test_bf16_layers_keep_bf16_activations():
    """A bf16 model keeps bf16 activations; gates and the recurrence run in float32 inside."""
    for kind, cfgs in CONFIGS.items():
        layer = TORCH_LAYERS[kind](**cfgs[0]).bfloat16()
        y = layer(torch.randn(1, 20, layer.hidden_size, dtype=torch.bfloat16))
        assert y.dtype == torch.bfloat16 and y.isfinite().all(), kind


@pytest.mark.parametrize("dtype,tol", [(torch.float64, dict(atol=1e-10, rtol=0)), (torch.float32, dict(atol=1e-5, rtol=1e-5))],
                         ids=["f64", "f32"])
@pytest.mark.parametrize("kind,i", CASES)
def test_decoding_cache_matches_the_full_forward(kind, i, dtype, tol):
    """Prefill, chunked prefill and token steps from the cache (builders.cache) give the
    rows of the whole-sequence forward; a commit=False call peeks without writing."""
    layer, _ = _build(kind, CONFIGS[kind][i], dtype)
    x = torch.randn(2, 29, layer.hidden_size, dtype=dtype, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, cache, outs, start = layer(x), {}, [], 0
        for t in (9, 1, 1, 12, 1, 5):
            before = {n: v.clone() if torch.is_tensor(v) else v for n, v in cache.items()}
            torch.testing.assert_close(layer(x[:, start:start + t], cache=cache, commit=False), full[:, start:start + t], **tol)
            assert cache.keys() == before.keys() and all(
                torch.equal(v, before[n]) if torch.is_tensor(v) else v == before[n] for n, v in cache.items())
            outs.append(layer(x[:, start:start + t], cache=cache))
            start += t
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **tol)
    assert cache["pos"] == 29 and cache["state.recurrent"].dtype == torch.promote_types(dtype, torch.float32)
    convs = {n: v for n, v in cache.items() if n.startswith("state.conv")}
    W = CONFIGS[kind][i].get("conv_kernel" if kind == "mamba2" else "conv_size", 4)
    assert all(v.shape[0] == 2 and v.shape[-1] == W and v.dtype == dtype for v in convs.values())
    assert bool(convs) == CONFIGS[kind][i].get("use_short_conv", True)


def test_fla_layers_point_decoding_to_the_torch_backend():
    layer = make_fla("gdn", **CONFIGS["gdn"][0])
    with pytest.raises(NotImplementedError, match="backend='torch'"):
        layer(torch.randn(1, 3, 64), cache={})


def test_mamba2_spec_default_chunk_lets_each_backend_pick():
    """Mamba2Spec's chunk_size default (None) builds a torch layer that picks its chunk from
    T (chunk_size_for) and an fla layer with fla's own default; a value set is kept by both."""
    import inspect

    from builders.layers.linear_mixers import fla_layer_class
    from builders.registry import BuildCtx, build_op
    from nas.spec import Mamba2Spec

    spec = {"head_dim": 8, "state_size": 8}
    assert build_op(Mamba2Spec(**spec), BuildCtx(width=16)).chunk_size is None
    assert build_op(Mamba2Spec(**spec, chunk_size=32), BuildCtx(width=16)).chunk_size == 32
    fla_default = inspect.signature(fla_layer_class("mamba2")).parameters["chunk_size"].default
    assert build_op(Mamba2Spec(**spec), BuildCtx(width=16, backend="fla")).chunk_size == fla_default
    assert build_op(Mamba2Spec(**spec, chunk_size=32), BuildCtx(width=16, backend="fla")).chunk_size == 32
