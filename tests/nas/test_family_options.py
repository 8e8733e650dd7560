"""The DSL options production hybrids need (Qwen3-Next, OLMo-Hybrid): zero-centred RMSNorm,
post-norm layers, partial rotary, q/k norm as a norm spec and over all heads, a gated
shared expert. Each: exact parameters against the built model, forward against a
hand-written reference, decode equal to the forward, field-named errors."""
import pytest
import torch
import torch.nn.functional as F

from builders.model import build_model
from nas import loads_arch, unique_params
from nas.cost import cost
from nas.errors import SpecError

ATTN = "{kind: attn, num_heads: 4, num_kv_heads: 2, head_dim: 16}"
BASE = "model: {vocab_size: 64, width: 32, defaults: {swiglu: {hidden_size: 48}}}\n"


def arch(text: str):
    return loads_arch(BASE + text)


def built(a, seed=0):
    torch.manual_seed(seed)
    model = build_model(a, backend="torch").double().eval()
    with torch.no_grad():  # zero-initialised tensors would hide mistakes: make every weight non-trivial
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def ids(seed=1, t=11):
    return torch.randint(0, 64, (2, t), generator=torch.Generator().manual_seed(seed))


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


OPTIONS = {
    "zero-centred": "model: {vocab_size: 64, width: 32, norm: {zero_centered: true}}\n"
                    f"num_layers: 2\nlayer: {{mixer: {ATTN}}}\n",
    "post-norm": f"num_layers: 2\nlayer: {{mixer: {ATTN}, norm_placement: post}}\n",
    "partial-rotary": f"num_layers: 1\nlayer: {{mixer: {ATTN[:-1]}, rope_dim: 8}}}}\n",
    "qk-norm-spec": f"num_layers: 1\nlayer: {{mixer: {ATTN[:-1]}, qk_norm: {{eps: 1.0e-6, zero_centered: true}}}}}}\n",
    "qk-norm-heads": f"num_layers: 1\nlayer: {{mixer: {ATTN[:-1]}, qk_norm: {{kind: layernorm}}, qk_norm_over: heads}}}}\n",
    "shared-gate": f"num_layers: 1\nlayer: {{mixer: {ATTN}, ffn: {{kind: moe, num_experts: 3, top_k: 2, "
                   "expert_hidden: 16, shared_expert_hidden: 24, shared_expert_gate: true}}\n",
}


def _text(name):
    return OPTIONS[name] if name == "zero-centred" else BASE + OPTIONS[name]


@pytest.mark.parametrize("name", OPTIONS)
def test_parameters_equal_the_cost_model(name):
    a = loads_arch(_text(name))
    model = build_model(a, backend="torch", device="meta")
    assert unique_params(a) == cost(a).unique_params == sum(p.numel() for p in model.parameters())
    for row in cost(a).figures.ops:
        assert row.params == sum(p.numel() for p in getattr(model.layers[row.layer], row.op).parameters())


@pytest.mark.parametrize("name", ["post-norm", "partial-rotary", "qk-norm-spec", "qk-norm-heads"])
def test_decode_equals_the_forward(name):
    model = built(loads_arch(_text(name)))
    x = ids(t=9)
    full = model(x).logits
    logits, cache = model.prefill(x[:, :5])
    steps = [logits] + [model.decode(cache, x[:, t:t + 1]) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)


def test_zero_centred_norm_is_rms_times_one_plus_weight():
    zc = built(loads_arch(OPTIONS["zero-centred"]))
    plain = build_model(loads_arch(OPTIONS["zero-centred"].replace("norm: {zero_centered: true}", "norm: {}")),
                        backend="torch").double().eval()
    fresh = build_model(loads_arch(OPTIONS["zero-centred"]), backend="torch")
    assert all(not m.weight.detach().any() for n, m in fresh.named_modules() if n.endswith("norm"))
    state = {k: (1 + v if k.endswith("norm.weight") and "mixer." not in k else v) for k, v in zc.state_dict().items()}
    plain.load_state_dict(state)
    torch.testing.assert_close(zc(ids()).logits, plain(ids()).logits, rtol=0, atol=1e-12)


def test_post_norm_block_is_residual_plus_normed_output():
    model = built(arch(OPTIONS["post-norm"]))
    block, h = model.layers[0], torch.randn(2, 7, 32, dtype=torch.float64)
    mixed = h + block.mixer_norm(block.mixer(h))
    expect = mixed + block.ffn_norm(block.ffn(mixed))
    torch.testing.assert_close(block.run_ffn(block.run_mixer(h)), expect, rtol=0, atol=0)
    pre = built(arch(OPTIONS["post-norm"].replace(", norm_placement: post", "")))
    pre.load_state_dict(model.state_dict())
    assert not torch.allclose(pre(ids()).logits, model(ids()).logits)


ROPE_TOL = 1e-6  # the rotary tables are float32 (as fla's), the rest float64


def _rotate(x, theta, r):
    """Reference partial rotary on (B, T, H, D): channel pairs (i, i + r/2), i < r/2, of
    the first r channels turn by position · θ^(-2i/r); the rest pass through."""
    t = torch.arange(x.shape[1], dtype=torch.float64)
    freq = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = (t[:, None] * freq)[None, :, None, :]  # (1, T, 1, r/2)
    a, b = x[..., : r // 2], x[..., r // 2: r]
    return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos(), x[..., r:]], -1)


def test_partial_rotary_turns_only_the_first_channels():
    attn = built(arch(OPTIONS["partial-rotary"])).layers[0].mixer
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    q, k, _ = attn.project(x)
    q0, k0 = (p(x).unflatten(-1, (-1, 16)) for p in (attn.q_proj, attn.k_proj))
    torch.testing.assert_close(q, _rotate(q0, 10000.0, 8), rtol=0, atol=ROPE_TOL)
    torch.testing.assert_close(k, _rotate(k0, 10000.0, 8), rtol=0, atol=ROPE_TOL)
    full = arch(OPTIONS["partial-rotary"].replace("rope_dim: 8", "rope_dim: 16"))
    assert full.layers[0].mixer.rope_dim == 16
    twin = built(full).layers[0].mixer
    twin.load_state_dict(attn.state_dict())
    torch.testing.assert_close(twin.project(x)[0], _rotate(q0, 10000.0, 16), rtol=0, atol=ROPE_TOL)


def test_qk_norm_spec_and_span():
    per_head = built(arch(OPTIONS["qk-norm-spec"])).layers[0].mixer
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    q, _, _ = per_head.project(x)
    raw = per_head.q_proj(x).unflatten(-1, (-1, 16))
    assert per_head.q_norm.weight.shape == (16,)
    torch.testing.assert_close(q, _rotate(rms(raw, 1 + per_head.q_norm.weight, 1e-6), 10000.0, 16), rtol=0, atol=ROPE_TOL)
    over = built(arch(OPTIONS["qk-norm-heads"])).layers[0].mixer
    assert over.q_norm.weight.shape == (64,) and over.k_norm.weight.shape == (32,)
    _, k, _ = over.project(x)
    normed = F.layer_norm(over.k_proj(x), (32,), over.k_norm.weight, over.k_norm.bias, over.k_norm.eps)
    torch.testing.assert_close(k, _rotate(normed.unflatten(-1, (-1, 16)), 10000.0, 16), rtol=0, atol=ROPE_TOL)


def test_shared_expert_gate_scales_the_shared_expert():
    moe = built(arch(OPTIONS["shared-gate"])).layers[0].ffn
    x = torch.randn(6, 32, dtype=torch.float64)
    routing, _ = moe.route(x)
    shared = torch.sigmoid(x @ moe.shared_expert_gate.weight.T) * moe.shared_expert(x)
    torch.testing.assert_close(moe(x), moe.dispatch(x, routing) + shared, rtol=0, atol=1e-12)


@pytest.mark.parametrize("text,path", [
    ("model: {vocab_size: 8, width: 32, norm: {kind: layernorm, zero_centered: true}}\n"
     f"num_layers: 1\nlayer: {{mixer: {ATTN}}}\n", "model.norm"),
    (BASE + f"num_layers: 1\nlayer: {{mixer: {ATTN[:-1]}, rope_dim: 18}}}}\n",
     "layer.mixer.rope_dim"),
    (BASE + f"num_layers: 1\nlayer: {{mixer: {ATTN[:-1]}, rope_dim: 6, rope_theta: null}}}}\n",
     "layer.mixer.rope_dim"),
    (BASE + f"num_layers: 1\nlayer: {{mixer: {ATTN[:-1]}, qk_norm_over: heads}}}}\n",
     "layer.mixer.qk_norm_over"),
    (BASE + f"num_layers: 1\nlayer: {{mixer: {ATTN}, ffn: {{kind: moe, shared_expert_gate: true}}}}\n",
     "layer.ffn.shared_expert_gate"),
    (BASE + f"num_layers: 1\nlayer: {{mixer: {ATTN}, norm_placement: middle}}\n", "layer.norm_placement"),
])
def test_field_named_errors(text, path):
    with pytest.raises(SpecError) as info:
        loads_arch(text)
    assert path in [p.path for p in info.value.problems], info.value.problems


def test_post_norm_survives_hybrid_sugar_and_unrolling():
    from nas.twin import unrolled_twin

    a = arch(f"num_layers: 2\nlayer: {{mixer: {ATTN}, norm_placement: post}}\n"
             f"hybrid: {{ratio: {{a: 1, g: 1}}, mixers: {{a: {ATTN}, g: {{kind: gdn, num_heads: 2, head_dim: 8}}}}}}\n"
             "loop: {boundary: block, T: 2}\n")
    assert [l.norm_placement for l in a.layers] == ["post", "post"]
    twin, _ = unrolled_twin(a)
    assert [l.norm_placement for l in twin.layers] == ["post"] * 4
