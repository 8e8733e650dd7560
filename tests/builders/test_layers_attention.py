"""Torch attention layers against fla's parameters and a hand-written copy of fla's layer math.

fla's kernels need CUDA, so the references rebuild each fla ``forward`` from fla's pure-torch
pieces (``rms_norm_ref``, ``rotary_embedding_ref``, ``naive_parallel_attn``, ``naive_nsa``).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from helpers import randomize
from builders.layers.attention import Attention, DeepSeekSparseAttention, NativeSparseAttention, make_fla

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # fla warns that Triton / flash-attn are missing on CPU
    import fla.ops.nsa.naive as fla_nsa
    from fla.layers.attn import Attention as FlaAttention
    from fla.layers.nsa import NativeSparseAttention as FlaNSA
    from fla.modules.norm.layernorm import rms_norm_ref
    from fla.modules.rotary.ops import RotaryEmbedding, rotary_embedding_ref
    from fla.ops.attn.naive import naive_parallel_attn
    from fla.ops.dsa.naive import naive_dsa



def heads(x, linear, d):
    return F.linear(x, linear.weight, linear.bias).unflatten(-1, (-1, d))


def rope(q, k, theta):
    """fla's RotaryEmbedding tables and rotary_embedding_ref."""
    if theta is None:
        return q, k
    t = q.shape[1]
    r = RotaryEmbedding(dim=q.shape[-1], base=theta)
    r._update_cos_sin_cache(t, device=q.device, dtype=q.dtype)
    cos, sin = r._cos_cached[:t], r._sin_cached[:t]
    return rotary_embedding_ref(q, cos, sin), rotary_embedding_ref(k, cos, sin)


def qkv_reference(layer, x):
    """fla Attention.forward up to the attention call: projections, qk_norm, rotary."""
    d = layer.head_dim
    q, k, v = heads(x, layer.q_proj, d), heads(x, layer.k_proj, d), heads(x, layer.v_proj, d)
    if layer.qk_norm:
        q = rms_norm_ref(q, layer.q_norm.weight, None, eps=1e-5)
        k = rms_norm_ref(k, layer.k_norm.weight, None, eps=1e-5)
    return (*rope(q, k, layer.rope_theta), v)


def attn_reference(layer, x, window, gate=None):
    """fla Attention.forward (flash_attn_func -> naive_parallel_attn), with an optional
    Qwen3-Next output gate weight applied per head and channel before o_proj."""
    q, k, v = qkv_reference(layer, x)
    o = naive_parallel_attn(q, k, v, window_size=window)[0]
    if gate is not None:
        o = o * torch.sigmoid(x @ gate.T).unflatten(-1, (-1, layer.head_dim))
    return o.flatten(2) @ layer.o_proj.weight.T


ATTN_CASES = {
    "B2-T63-H4-plain": (dict(hidden_size=64, num_heads=4), 2, 63),
    "B2-T63-H4-KV2-norm-bias-w16": (dict(hidden_size=64, num_heads=4, num_kv_heads=2, qk_norm=True,
                                         qkv_bias=True, window_size=16), 2, 63),
    "B1-T1-H8-KV1-theta500-w7": (dict(hidden_size=64, num_heads=8, num_kv_heads=1, rope_theta=500.0,
                                      window_size=7), 1, 1),
    "B1-T40-H8-KV2-w1": (dict(hidden_size=64, num_heads=8, num_kv_heads=2, window_size=1), 1, 40),
}


def fla_and_torch(kind, kw, dtype=torch.float64):
    fla_layer = randomize(make_fla(kind, **kw).to(dtype))
    torch_layer = {"attn": Attention, "nsa": NativeSparseAttention}[kind](**kw).to(dtype)
    torch_layer.load_state_dict(fla_layer.state_dict(), strict=True)
    return fla_layer, torch_layer


@pytest.mark.parametrize("name", ATTN_CASES)
def test_attn_matches_fla_layer_math(name):
    kw, b, t = ATTN_CASES[name]
    fla_layer, layer = fla_and_torch("attn", kw)
    x = torch.randn(b, t, 64, dtype=torch.float64)
    torch.testing.assert_close(layer(x), attn_reference(fla_layer, x, kw.get("window_size")))


@pytest.mark.parametrize("kind,kw", [
    ("attn", dict(hidden_size=64, num_heads=4, num_kv_heads=2, qk_norm=True, qkv_bias=True)),
    ("nsa", dict(hidden_size=64, num_heads=16, num_kv_heads=1, head_dim=8, qkv_bias=True)),
], ids=["attn", "nsa"])
def test_state_dict_round_trips_strictly(kind, kw):
    fla_layer, layer = fla_and_torch(kind, kw)
    assert isinstance(fla_layer, {"attn": FlaAttention, "nsa": FlaNSA}[kind])
    assert list(fla_layer.state_dict()) == list(layer.state_dict())
    back = randomize(make_fla(kind, **kw).double(), seed=1)
    back.load_state_dict(layer.state_dict(), strict=True)
    for (name, p), (_, p_back) in zip(layer.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(p, p_back), name


def test_attn_window_override_equals_built_window():
    kw = dict(hidden_size=64, num_heads=4, num_kv_heads=2)
    full = randomize(Attention(**kw).double())
    swa = Attention(**kw, window_size=8).double()
    swa.load_state_dict(full.state_dict())
    x = torch.randn(2, 40, 64, dtype=torch.float64)
    assert torch.equal(full(x, window=8), swa(x))
    assert torch.equal(swa(x, window="full"), full(x))
    torch.testing.assert_close(swa(x, window=3), attn_reference(full, x, 3))
    assert not torch.allclose(full(x, window=8), full(x))
    torch.testing.assert_close(full(x[:, :8], window=8), full(x[:, :8]))  # a window >= T is full


def test_attn_output_gate_and_head_dim():
    layer = randomize(Attention(64, 4, 2, head_dim=24, output_gate=True, window_size=9).double())
    assert layer.g_proj.weight.shape == (96, 64) and layer.q_proj.weight.shape == (96, 64)
    x = torch.randn(2, 33, 64, dtype=torch.float64)
    torch.testing.assert_close(layer(x), attn_reference(layer, x, 9, gate=layer.g_proj.weight))
    ungated = Attention(64, 4, 2, head_dim=24, window_size=9).double()
    ungated.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "g_proj.weight"})
    assert not torch.allclose(layer(x), ungated(x))


def test_attn_rope_and_qk_norm_paths_matter():
    x = torch.randn(1, 20, 64, dtype=torch.float64)
    base = randomize(Attention(64, 4, qk_norm=True).double())
    for change in (dict(rope_theta=None), dict(rope_theta=100.0), dict(qk_norm=False)):
        other = Attention(**{**dict(hidden_size=64, num_heads=4, qk_norm=True), **change}).double()
        other.load_state_dict(base.state_dict(), strict=False)
        torch.testing.assert_close(other(x), attn_reference(other, x, None))
        assert not torch.allclose(other(x), base(x)), change


def test_make_fla_falls_back_where_fla_has_no_equivalent():
    assert type(make_fla("attn", hidden_size=64, num_heads=4, output_gate=True)) is Attention
    assert type(make_fla("attn", hidden_size=64, num_heads=4, head_dim=8)) is Attention
    assert type(make_fla("attn", hidden_size=64, num_heads=4, rope_theta=None)) is Attention
    nope_nsa = make_fla("nsa", hidden_size=64, num_heads=16, num_kv_heads=1, rope_theta=None)
    assert type(nope_nsa) is NativeSparseAttention
    for same_as_fla in (dict(head_dim=16, output_gate=False), dict(head_dim=None)):
        assert isinstance(make_fla("attn", hidden_size=64, num_heads=4, **same_as_fla), FlaAttention)
    with pytest.raises(ValueError, match="dsa"):
        make_fla("dsa", hidden_size=64)


def test_fla_attn_forward_off_cuda_is_one_usage_error():
    """fla's attention needs no flash-attn (its core is SDPA), but its rotary is a Triton kernel."""
    from builders.layers.fla_runtime import FlaUnavailableError

    layer = make_fla("attn", hidden_size=64, num_heads=4)
    with pytest.raises(FlaUnavailableError, match="CUDA"):
        layer(torch.randn(1, 4, 64))


def test_layers_pass_gradients_to_every_parameter():
    x = torch.randn(2, 24, 64)
    for layer in (Attention(64, 4, 2, qk_norm=True, qkv_bias=True, output_gate=True),
                  NativeSparseAttention(64, 16, 1, 8, block_size=4, block_counts=3, window_size=6)):
        layer(x).square().sum().backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


DSA_KW = dict(hidden_size=64, num_heads=4, num_kv_heads=2, index_heads=3, index_head_dim=8, topk=7)


def dsa_reference(layer, x):
    """Projections as fla Attention, the indexer by hand, then fla's naive_dsa."""
    q, k, v = qkv_reference(layer, x)
    ix = layer.indexer
    q_idx, k_idx = rope(heads(x, ix.q_proj, 8), heads(x, ix.k_proj, 8), layer.rope_theta)
    w_idx = (x @ ix.weights_proj.weight.T) * ix.index_heads ** -0.5
    o = naive_dsa(q, k, v, q_idx, k_idx.squeeze(2), w_idx, topk=layer.topk)
    return o.flatten(2) @ layer.o_proj.weight.T


def test_dsa_matches_reference_and_parameter_names():
    # 16 index heads: a key scores exactly 0 (a relu tie, which our top-k and torch.topk break
    # differently) only when all 16 relus vanish, so no row here has a tie at its top-k boundary
    layer = randomize(DeepSeekSparseAttention(**{**DSA_KW, "index_heads": 16}, qk_norm=True)).eval()
    assert [n for n, _ in layer.named_parameters()] == [
        "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_norm.weight", "k_norm.weight",
        "indexer.q_proj.weight", "indexer.k_proj.weight", "indexer.weights_proj.weight"]
    x = torch.randn(2, 63, 64)
    torch.testing.assert_close(layer(x), dsa_reference(layer, x), atol=2e-5, rtol=2e-5)


def test_dsa_overrides_and_dense_limit():
    x = torch.randn(2, 30, 64, dtype=torch.float64)
    layer = randomize(DeepSeekSparseAttention(**DSA_KW).double()).eval()
    built = lambda **kw: DeepSeekSparseAttention(**{**DSA_KW, **kw}).double().eval()  # noqa: E731
    top3, swa5 = built(topk=3), built(window_size=5)
    for other in (top3, swa5):
        other.load_state_dict(layer.state_dict())
    assert torch.equal(layer(x, topk=3), top3(x)) and torch.equal(layer(x, window=5), swa5(x))
    assert torch.equal(swa5(x, window="full"), layer(x))
    assert not torch.allclose(layer(x, topk=3), layer(x))
    # top-k >= T attends densely: the same as plain attention with the same projections
    dense = Attention(64, 4, 2).double()
    dense.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("indexer.")})
    torch.testing.assert_close(layer(x, topk=30), dense(x))


def test_dsa_indexer_learns_only_from_its_kl_loss():
    layer = randomize(DeepSeekSparseAttention(**DSA_KW).double())
    x = torch.randn(2, 25, 64, dtype=torch.float64, requires_grad=True)
    out, (aux,) = layer(x, return_aux=True)
    torch.testing.assert_close(out, layer(x))  # return_aux changes nothing else
    out.sum().backward(retain_graph=True)
    assert all(p.grad is None for p in layer.indexer.parameters())
    layer.zero_grad(set_to_none=True)
    x.grad = None
    aux.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.indexer.parameters())
    # the indexer's input and target are detached: nothing else learns from its loss
    assert x.grad is None
    assert all(p.grad is None for n, p in layer.named_parameters() if not n.startswith("indexer."))
    layer.eval()
    assert layer(x, return_aux=True)[1] == []  # no indexer loss in eval


def test_dsa_indexer_loss_value():
    """KL(p || softmax I) by hand for each query: p = head-mean of the main attention over the kept keys."""
    layer = randomize(DeepSeekSparseAttention(**DSA_KW).double())
    x = torch.randn(1, 12, 64, dtype=torch.float64)
    _, (aux,) = layer(x, return_aux=True)
    q, k, _ = qkv_reference(layer, x)
    k = k.repeat_interleave(2, dim=2)
    ix = layer.indexer
    q_idx, k_idx = rope(heads(x, ix.q_proj, 8), heads(x, ix.k_proj, 8), layer.rope_theta)
    w_idx = (x @ ix.weights_proj.weight.T) * 3 ** -0.5
    total = 0.0
    for t in range(12):
        index = (w_idx[0, t, :, None] * torch.relu(q_idx[0, t] @ k_idx[0, :t + 1, 0].T / 8 ** 0.5)).sum(0)
        sel = index.topk(min(7, t + 1)).indices
        p = torch.softmax(torch.einsum("hd,shd->hs", q[0, t], k[0, sel]) / 4, -1).mean(0)
        total += (p * (p.log() - torch.log_softmax(index[sel], -1))).sum()
    torch.testing.assert_close(aux, total / 12)
    assert aux > 0


NSA_KW = dict(hidden_size=64, num_heads=16, num_kv_heads=1, head_dim=8,  # fla's naive NSA needs HQ / H >= 16
              block_size=8, block_counts=3, window_size=16)


def nsa_reference(layer, x, window, monkeypatch):
    """fla NativeSparseAttention.forward with naive_nsa in place of parallel_nsa; its Triton
    pooling and flash-attn window branch swapped for pure-torch equivalents."""
    monkeypatch.setattr(fla_nsa, "mean_pooling", lambda k, bs, cu_seqlens=None: torch.stack(
        [k[:, i:i + bs].mean(1) for i in range(0, k.shape[1], bs)], 1))
    monkeypatch.setattr(fla_nsa, "flash_attn_func", lambda q, k, v, causal, window_size: naive_parallel_attn(
        q, k, v, window_size=window_size[0] + 1)[0])
    d = layer.head_dim
    q, k = rope(heads(x, layer.q_proj, d), heads(x, layer.k_proj, d), layer.rope_theta)
    g_cmp, g_slc, g_swa = heads(x, layer.g_proj, 3).sigmoid().unbind(-1)
    o = fla_nsa.naive_nsa(q, k, heads(x, layer.v_proj, d), g_cmp, g_slc, g_swa, block_counts=layer.block_counts,
                          block_size=layer.block_size, window_size=window)
    return o.flatten(2) @ layer.o_proj.weight.T


@pytest.mark.parametrize("b,t", [(2, 63), (1, 1), (1, 64)], ids=["B2-T63", "B1-T1", "B1-T64"])
def test_nsa_matches_fla_layer_math(b, t, monkeypatch):
    fla_layer, layer = fla_and_torch("nsa", NSA_KW, torch.float32)
    x = torch.randn(b, t, 64)
    torch.testing.assert_close(layer(x), nsa_reference(fla_layer, x, 16, monkeypatch), atol=2e-5, rtol=2e-5)


def test_nsa_window_override_equals_built_window(monkeypatch):
    layer = randomize(NativeSparseAttention(**NSA_KW).double())
    x = torch.randn(2, 40, 64, dtype=torch.float64)
    for override, built_window in ((5, 5), ("full", 40), (0, 0)):
        built = NativeSparseAttention(**{**NSA_KW, "window_size": built_window}).double()
        built.load_state_dict(layer.state_dict())
        assert torch.equal(layer(x, window=override), built(x)), override
    assert not torch.allclose(layer(x, window=5), layer(x))
    no_swa = nsa_reference(layer, x, 0, monkeypatch)  # fla's naive NSA computes in fp32
    torch.testing.assert_close(layer(x, window=0), no_swa, atol=1e-5, rtol=1e-5)
