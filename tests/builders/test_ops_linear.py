"""Chunked linear-recurrent ops vs token recurrences and fla's naive references, forward and gradients.

Tolerances: float64 chunk-vs-recurrence agree to 1e-9 (round-off only). fla's naive references
compute in float32 whatever the input, so comparisons with them run in float32 at 2e-4 (abs. and
rel.), which covers the different summation orders over up to 100 tokens.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from builders.ops import conv as conv_ops
from builders.ops.conv import causal_conv1d
from builders.ops.linear import (
    CPU_RULES,
    MAX_CHUNK,
    chunk_delta_rule,
    chunk_gated_delta_rule,
    chunk_kda,
    chunk_size_for,
    chunk_ssd,
    recurrent_delta_rule_ref,
    recurrent_gated_delta_rule_ref,
    recurrent_kda_ref,
    recurrent_ssd_ref,
)
from builders.ops.norm import l2_norm, rms_norm, rms_norm_gated

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.modules.norm.layernorm import rms_norm_ref as fla_rms_norm_ref
    from fla.modules.norm.layernorm_gated import rms_norm_ref as fla_gated_rms_norm_ref
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
    from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla


pytestmark = pytest.mark.usefixtures("one_thread")

F64 = dict(atol=1e-9, rtol=1e-9)
F32 = dict(atol=2e-4, rtol=2e-4)

SHAPES = [(2, 63, 4, 32), (1, 1, 2, 16), (2, 100, 2, 16), (1, 64, 1, 8)]
SHAPE_IDS = [f"B{b}-T{t}-H{h}-D{d}" for b, t, h, d in SHAPES]


def _delta_inputs(B, T, H, D, dtype, seed=0, HV=None, per_channel=False, h0=True, decay_scale=1.0):
    """q, k, v, g, beta, h0 with leaf grads; g is (B,T,HV) or (B,T,HV,D) log decay, k unit-norm."""
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    g_shape = (B, T, HV, D) if per_channel else (B, T, HV)
    xs = dict(
        q=rand(B, T, H, D),
        k=F.normalize(rand(B, T, H, D), dim=-1),
        v=rand(B, T, HV, D),
        g=decay_scale * F.logsigmoid(rand(*g_shape) + 2),
        beta=torch.sigmoid(rand(B, T, HV)),
        initial_state=rand(B, HV, D, D) if h0 else None,
    )
    return {n: None if x is None else x.to(dtype).requires_grad_() for n, x in xs.items()}


def _loss(o, S, seed=1):
    """A random linear functional of (o, S), the same in every dtype, so gradients test every output entry."""
    gen = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum()
    if S is not None:
        loss = loss + (S * torch.randn(S.shape, generator=gen, dtype=torch.float64).to(S.dtype)).sum()
    return loss


def _fwd_bwd(fn, inputs, **kwargs):
    o, S = fn(**inputs, **kwargs)
    leaves = [x for x in inputs.values() if x is not None]
    grads = torch.autograd.grad(_loss(o, S), leaves)
    return o, S, grads


def _assert_all_close(got, want, tol):
    o1, S1, g1 = got
    o2, S2, g2 = want
    torch.testing.assert_close(o1, o2.to(o1.dtype), **tol)
    if S2 is not None:
        torch.testing.assert_close(S1, S2.to(S1.dtype), **tol)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), **tol)


def _drop(inputs, name):
    return {n: x for n, x in inputs.items() if n != name}


@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_gdn_chunk_matches_recurrence_f64(B, T, H, D, h0, chunk_size):
    inputs = _delta_inputs(B, T, H, D, torch.float64, h0=h0)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    got = _fwd_bwd(chunk_gated_delta_rule, inputs, chunk_size=chunk_size, **kw)
    _assert_all_close(got, _fwd_bwd(recurrent_gated_delta_rule_ref, inputs, **kw), F64)


@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_gdn_chunk_matches_fla_naive_f32(B, T, H, D):
    inputs = _delta_inputs(B, T, H, D, torch.float32)
    got = _fwd_bwd(chunk_gated_delta_rule, inputs, chunk_size=32, output_final_state=True)
    fla_rec = _fwd_bwd(
        lambda q, k, v, g, beta, **kw: naive_recurrent_gated_delta_rule(q, k, v, beta, g, **kw),
        inputs,
        output_final_state=True,
    )
    fla_chunk = _fwd_bwd(naive_chunk_gated_delta_rule, inputs, chunk_size=16, output_final_state=True)
    _assert_all_close(got, fla_rec, F32)
    _assert_all_close(got, fla_chunk, F32)


@pytest.mark.parametrize("HV", [4, 8], ids=["HV4", "HV8"])
def test_grouped_value_heads_read_their_qk_head(HV):
    """GVA: value head h uses q/k head h // (HV / H), like fla's kernels."""
    inputs = _delta_inputs(2, 40, 2, 8, torch.float64, HV=HV)
    got = _fwd_bwd(chunk_gated_delta_rule, inputs, chunk_size=16, output_final_state=True)
    expanded = dict(inputs, q=inputs["q"].repeat_interleave(HV // 2, 2), k=inputs["k"].repeat_interleave(HV // 2, 2))
    o, S = recurrent_gated_delta_rule_ref(**expanded, output_final_state=True)
    torch.testing.assert_close(got[0], o, **F64)
    torch.testing.assert_close(got[1], S, **F64)


@pytest.mark.parametrize("chunk_size", [16, 48], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_delta_rule_chunk_matches_recurrence_f64(B, T, H, D, chunk_size):
    inputs = _drop(_delta_inputs(B, T, H, D, torch.float64), "g")
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    got = _fwd_bwd(chunk_delta_rule, inputs, chunk_size=chunk_size, **kw)
    _assert_all_close(got, _fwd_bwd(recurrent_delta_rule_ref, inputs, **kw), F64)


@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_delta_rule_chunk_matches_fla_naive_f32(B, T, H, D):
    inputs = _drop(_delta_inputs(B, T, H, D, torch.float32), "g")

    def fla_ref(q, k, v, beta, initial_state):
        heads_first = (x.transpose(1, 2) for x in (q, k, v, beta))
        o, S = delta_rule_recurrence(*heads_first, initial_state=initial_state, output_final_state=True)
        return o.transpose(1, 2), S

    got = _fwd_bwd(chunk_delta_rule, inputs, chunk_size=32, output_final_state=True)
    _assert_all_close(got, _fwd_bwd(fla_ref, inputs), F32)


@pytest.mark.parametrize("chunk_size", [24, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_kda_chunk_matches_recurrence_f64(B, T, H, D, h0, chunk_size):
    inputs = _delta_inputs(B, T, H, D, torch.float64, HV=2 * H, per_channel=True, h0=h0)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    got = _fwd_bwd(chunk_kda, inputs, chunk_size=chunk_size, **kw)
    _assert_all_close(got, _fwd_bwd(recurrent_kda_ref, inputs, **kw), F64)


@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_kda_chunk_matches_fla_naive_f32(B, T, H, D):
    inputs = _delta_inputs(B, T, H, D, torch.float32, HV=2 * H, per_channel=True)
    got = _fwd_bwd(chunk_kda, inputs, chunk_size=32, output_final_state=True)
    _assert_all_close(got, _fwd_bwd(naive_recurrent_kda, inputs, output_final_state=True), F32)
    if T % 16 == 0:  # fla's naive chunk form needs whole chunks
        _assert_all_close(got, _fwd_bwd(naive_chunk_kda, inputs, chunk_size=16, output_final_state=True), F32)


def test_strong_decays_stay_finite_f32():
    """Decays that sum below -88 inside one chunk (exp of their negation overflows float32) stay finite."""
    inputs = _delta_inputs(2, 80, 2, 16, torch.float32, per_channel=True, decay_scale=40.0)
    assert inputs["g"].detach()[:, :64].sum(1).max() < -200
    got = _fwd_bwd(chunk_kda, inputs, chunk_size=64, output_final_state=True)
    inputs64 = {n: x.detach().double().requires_grad_() for n, x in inputs.items()}
    want = _fwd_bwd(recurrent_kda_ref, inputs64, output_final_state=True)
    assert all(t.isfinite().all() for t in (got[0], got[1], *got[2]))
    _assert_all_close(got, want, F32)


def test_chunk_kda_gradcheck():
    inputs = _delta_inputs(1, 7, 1, 4, torch.float64, per_channel=True)
    names = list(inputs)

    def fn(*xs):
        o, S = chunk_kda(**dict(zip(names, xs)), chunk_size=5, output_final_state=True)
        return o, S

    assert torch.autograd.gradcheck(fn, tuple(inputs.values()), fast_mode=True)


def _ssd_inputs(B, T, H, P, N, dtype, seed=0, h0=True):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    xs = dict(
        x=rand(B, T, H, P),
        dt=F.softplus(rand(B, T, H) - 1),
        A=-torch.exp(rand(H)),
        B=rand(B, T, H, N),
        C=rand(B, T, H, N),
        D=rand(H),
        initial_state=rand(B, H, P, N) if h0 else None,
    )
    return {n: None if x is None else x.to(dtype).requires_grad_() for n, x in xs.items()}


@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_ssd_chunk_matches_recurrence_f64(B, T, H, D, h0, chunk_size):
    inputs = _ssd_inputs(B, T, H, D, D // 2, torch.float64, h0=h0)
    got = _fwd_bwd(chunk_ssd, inputs, chunk_size=chunk_size, output_final_state=True)
    _assert_all_close(got, _fwd_bwd(recurrent_ssd_ref, inputs, output_final_state=True), F64)


def test_ssd_per_channel_skip_f64():
    inputs = _ssd_inputs(2, 30, 2, 8, 4, torch.float64)
    inputs["D"] = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    got = _fwd_bwd(chunk_ssd, inputs, chunk_size=16, output_final_state=True)
    _assert_all_close(got, _fwd_bwd(recurrent_ssd_ref, inputs, output_final_state=True), F64)


@pytest.mark.parametrize("B,T,H,D", SHAPES, ids=SHAPE_IDS)
def test_ssd_chunk_matches_fla_simple_gla_f32(B, T, H, D):
    """SSD is scalar-decay linear attention: q=C, k=B, v=dt*x, g=dt*A, scale 1, state transposed."""
    inputs = _ssd_inputs(B, T, H, D, D // 2, torch.float32)

    def fla_ref(x, dt, A, B, C, D, initial_state):
        o, S = naive_recurrent_simple_gla(
            C, B, x * dt[..., None], dt * A, scale=1.0, initial_state=initial_state.mT, output_final_state=True
        )
        return o + x * D[:, None], S.mT

    got = _fwd_bwd(chunk_ssd, inputs, chunk_size=32, output_final_state=True)
    _assert_all_close(got, _fwd_bwd(fla_ref, inputs), F32)


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("T,W", [(1, 4), (63, 4), (10, 2)], ids=["T1-W4", "T63-W4", "T10-W2"])
def test_causal_conv1d_matches_conv1d_module(T, W, activation):
    """fla's ShortConvolution is an nn.Conv1d with padding W-1, output cut to T."""
    conv = nn.Conv1d(12, 12, W, groups=12, padding=W - 1, bias=True).double()
    x = torch.randn(2, T, 12, dtype=torch.float64, requires_grad=True)
    want = conv(x.transpose(1, 2))[..., :T].transpose(1, 2)
    want = want if activation is None else F.silu(want)
    got = causal_conv1d(x, conv.weight, conv.bias, activation)
    torch.testing.assert_close(got, want, **F64)
    g1, g2 = (torch.autograd.grad(_loss(y, None), (x, conv.weight)) for y in (got, want))
    torch.testing.assert_close(g1, g2, **F64)


def test_causal_conv1d_is_causal():
    x = torch.randn(1, 20, 3, dtype=torch.float64)
    w = torch.randn(3, 4, dtype=torch.float64)
    y1 = causal_conv1d(x, w)
    x2 = x.clone()
    x2[:, 11:] += 1.0
    y2 = causal_conv1d(x2, w)
    assert torch.equal(y1[:, :11], y2[:, :11]) and not torch.equal(y1[:, 11:], y2[:, 11:])


def test_norms_match_fla_references():
    x, z = torch.randn(2, 5, 3, 16, dtype=torch.float64), torch.randn(2, 5, 3, 16, dtype=torch.float64)
    w = torch.randn(16).double()  # fla's gated reference casts weights to float32
    torch.testing.assert_close(rms_norm(x, w, 1e-5), fla_rms_norm_ref(x, w, None, eps=1e-5), **F64)
    gated = fla_gated_rms_norm_ref(x, w, None, z=z, eps=1e-5, norm_before_gate=True, upcast=False)
    torch.testing.assert_close(rms_norm_gated(x, z, w, 1e-5, "swish"), gated, **F64)
    sigmoid_gated = rms_norm(x, w, 1e-5) * torch.sigmoid(z)
    torch.testing.assert_close(rms_norm_gated(x, z, w, 1e-5, "sigmoid"), sigmoid_gated, **F64)
    x2, z2, w2 = x.flatten(-2), z.flatten(-2), torch.randn(48).double()
    mamba = fla_gated_rms_norm_ref(x2, w2, None, z=z2, eps=1e-5, group_size=16, norm_before_gate=False, upcast=False)
    got = rms_norm_gated(x2, z2, w2, 1e-5, "swish", group_size=16, norm_before_gate=False)
    torch.testing.assert_close(got, mamba, **F64)
    torch.testing.assert_close(l2_norm(x), x / torch.sqrt(x.square().sum(-1, keepdim=True) + 1e-6), **F64)


def test_low_precision_inputs_keep_dtype_and_compute_in_f32():
    inputs = {n: x.detach() for n, x in _delta_inputs(2, 40, 2, 16, torch.float32).items()}
    bf16 = {n: x.bfloat16() for n, x in inputs.items()}
    o, S = chunk_gated_delta_rule(**bf16, output_final_state=True)
    want, _ = recurrent_gated_delta_rule_ref(**{n: x.float() for n, x in bf16.items()})
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    torch.testing.assert_close(o.float(), want, atol=2e-2, rtol=2e-2)
    ssd = {n: x.detach().bfloat16() for n, x in _ssd_inputs(1, 20, 2, 8, 4, torch.float32).items()}
    y, h = chunk_ssd(**ssd, output_final_state=True)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32


# -- the chunk-size rule (chunk_size=None) and the CPU conv ------------------------------------

RULE_TS = [1, 2, 3, 8, 17, 64, 100]


@pytest.mark.parametrize("T", RULE_TS + [4, 5, 16, 32, 48, 49, 65, 512], ids=lambda t: f"T{t}")
def test_chunk_size_rule_pads_under_one_token_per_chunk(T):
    for device, kind in itertools.product(("cpu", "cuda"), CPU_RULES):
        C = chunk_size_for(T, device, kind)
        recurrent_max_t, one_chunk_max_t, cpu_largest = CPU_RULES[kind]
        if device == "cpu" and T <= recurrent_max_t:
            assert C == 0
        elif device == "cpu" and T <= one_chunk_max_t:
            assert C == T
        else:
            largest = cpu_largest if device == "cpu" else MAX_CHUNK
            n = -(-T // C)
            assert 0 < C <= largest and n == -(-T // largest) and n * C - T < n


def _rule_cases():
    """Every chunked op on (T, h0, final state): a state in and out, or neither (the zero-state skips)."""
    for T in RULE_TS:
        for h0, final in ((True, True), (False, False), (False, True)):
            yield pytest.param(T, h0, final, id=f"T{T}-{'h0' if h0 else 'no_h0'}-{'S' if final else 'no_S'}")


@pytest.mark.parametrize("T,h0,final", list(_rule_cases()))
@pytest.mark.parametrize("op", ["gdn", "delta_rule", "kda", "ssd"])
def test_rule_chunk_size_matches_recurrence_f64(op, T, h0, final):
    """chunk_size=None (chunk_size_for(T), or the token recurrence where it picks 0) equals the
    token-by-token reference, forward and every gradient, at every T the rule treats differently."""
    if op == "ssd":
        inputs = _ssd_inputs(2, T, 2, 8, 4, torch.float64, seed=T, h0=h0)
        chunk_fn, ref_fn = chunk_ssd, recurrent_ssd_ref
    else:
        inputs = _delta_inputs(2, T, 2, 8, torch.float64, seed=T, per_channel=op == "kda", h0=h0)
        if op == "delta_rule":
            inputs = _drop(inputs, "g")
        chunk_fn, ref_fn = {"gdn": (chunk_gated_delta_rule, recurrent_gated_delta_rule_ref),
                            "delta_rule": (chunk_delta_rule, recurrent_delta_rule_ref),
                            "kda": (chunk_kda, recurrent_kda_ref)}[op]
    got = _fwd_bwd(chunk_fn, inputs, chunk_size=None, output_final_state=final)
    want = _fwd_bwd(ref_fn, inputs, output_final_state=final)
    assert (got[1] is None) == (not final)
    _assert_all_close(got, want, F64)


def _conv1d_ref(x, w, bias, activation):
    """F.conv1d, depthwise, causal: the formula the CPU's shifted sums replace."""
    W = w.shape[-1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), w.reshape(w.shape[0], 1, W), bias, groups=w.shape[0])
    y = y.transpose(1, 2)
    return y if activation is None else F.silu(y)


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("T,W", [(1, 4), (3, 4), (37, 4), (10, 2), (9, 1)], ids=lambda v: str(v))
def test_shifted_conv_matches_conv1d_f32(T, W, activation, bias, strided, monkeypatch):
    """The CPU path (_ShiftedConv: W shifted multiply-adds with its own backward) against
    F.conv1d in float32: the output and the gradients of the input, the weight and the bias.
    ``strided``: the input is a column slice of a wider tensor, as the fused q/k/v projection
    hands it over."""
    calls = []
    apply = conv_ops._ShiftedConv.apply
    monkeypatch.setattr(conv_ops._ShiftedConv, "apply", lambda *a: calls.append(1) or apply(*a))
    gen = torch.Generator().manual_seed(T * 10 + W)
    D = 12
    src = torch.randn(2, T, 2 * D if strided else D, generator=gen).requires_grad_()
    x = src[..., 3:3 + D] if strided else src
    w = torch.randn(D, 1, W, generator=gen).requires_grad_()
    b = torch.randn(D, generator=gen).requires_grad_() if bias else None
    leaves = [t for t in (src, w, b) if t is not None]
    want = _conv1d_ref(x, w, b, activation)
    got = causal_conv1d(x, w, b, activation)
    assert calls, "the CPU path should run _ShiftedConv"
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for a, e in zip(torch.autograd.grad(_loss(got, None), leaves), torch.autograd.grad(_loss(want, None), leaves),
                    strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
