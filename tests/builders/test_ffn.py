"""SwiGLU against its math and fla's GatedMLP; MoE dispatch, balance loss and routing replay."""

import math
import warnings

import pytest
import torch

import helpers
from builders.layers.ffn import MoE, Routing, SwiGLU, swiglu_hidden

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # fla warns that Triton is missing on CPU
    from fla.modules import GatedMLP


def randomize(module, seed=0):
    return helpers.randomize(module, seed, vector_std=0.3).double()


def test_swiglu_is_its_math():
    ffn = randomize(SwiGLU(16, intermediate_size=24))
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    g, u, d = ffn.gate_proj.weight, ffn.up_proj.weight, ffn.down_proj.weight
    expected = ((x @ g.T) * torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T
    torch.testing.assert_close(ffn(x), expected)


@pytest.mark.parametrize("hidden,ratio,inter", [(64, None, None), (100, 3, None), (64, None, 40)])
def test_swiglu_matches_fla_gated_mlp_shapes_and_names(hidden, ratio, inter):
    fla_mlp = GatedMLP(hidden, hidden_ratio=ratio, intermediate_size=inter)
    ours = SwiGLU(hidden, hidden_ratio=ratio, intermediate_size=inter)
    assert ours.intermediate_size == fla_mlp.intermediate_size == swiglu_hidden(hidden, ratio, inter)
    fla_mlp.load_state_dict(ours.state_dict(), strict=True)
    ours.load_state_dict(fla_mlp.state_dict(), strict=True)


def loop_moe(moe, x, routing):
    """One token at a time: sum_j w[n, j] * expert_{i[n, j]}(x[n]) (+ the shared expert)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = []
    for n in range(flat.shape[0]):
        row = sum(w * moe.experts[int(i)](flat[n]) for i, w in zip(routing.indices[n], routing.weights[n]))
        rows.append(row + (moe.shared_expert(flat[n]) if moe.shared_expert is not None else 0))
    return torch.stack(rows).view_as(x)


def loop_routing(moe, x):
    probs = torch.softmax(x.reshape(-1, x.shape[-1]) @ moe.gate.weight.T, -1)
    rows = [torch.topk(p, moe.top_k) for p in probs]
    weights = [r.values / r.values.sum() for r in rows]
    return Routing(torch.stack([r.indices for r in rows]), torch.stack(weights))


@pytest.mark.parametrize("experts,top_k,shared,tokens", [(4, 2, 0, 21), (8, 1, 12, 3), (4, 3, 8, 21)],
                         ids=["E4-k2", "E8-k1-shared-N3", "E4-k3-shared"])
def test_moe_dispatch_matches_per_token_loop(experts, top_k, shared, tokens):
    moe = randomize(MoE(16, experts, top_k, expert_hidden=8, shared_expert_hidden=shared))
    x = torch.randn(1, tokens, 16, dtype=torch.float64, requires_grad=True)
    y, _, routing = moe(x, return_routing=True)
    ref_routing = loop_routing(moe, x)
    assert torch.equal(routing.indices, ref_routing.indices)
    y_ref = loop_moe(moe, x, ref_routing)
    torch.testing.assert_close(y, y_ref)
    params = [x, *moe.parameters()]
    do = torch.randn_like(y)
    g = torch.autograd.grad(y, params, do, allow_unused=True)
    g_ref = torch.autograd.grad(y_ref, params, do, allow_unused=True)
    for a, b in zip(g, g_ref, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


def test_moe_all_experts_under_uniform_router_is_their_mean():
    moe = randomize(MoE(16, 4, top_k=4, expert_hidden=8))
    torch.nn.init.zeros_(moe.gate.weight)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    mean = torch.stack([e(x) for e in moe.experts]).mean(0)
    y, aux, _ = moe(x, return_routing=True)
    torch.testing.assert_close(y, mean)
    torch.testing.assert_close(aux, torch.tensor(1.0, dtype=torch.float64))  # balanced


def test_moe_aux_loss_hand_computed():
    # router = identity on x in R^2: x = (ln 3, 0) gives probs (3/4, 1/4), x = (0, ln 3) the mirror.
    # three tokens pick expert 0, one picks expert 1: f = (3/4, 1/4), P = (5/8, 3/8),
    # aux = 2 * (3/4 * 5/8 + 1/4 * 3/8) = 9/8
    moe = MoE(2, num_experts=2, top_k=1, expert_hidden=4).double()
    with torch.no_grad():
        moe.gate.weight.copy_(torch.eye(2))
    a = math.log(3.0)
    x = torch.tensor([[a, 0.0], [a, 0.0], [a, 0.0], [0.0, a]], dtype=torch.float64)
    _, aux, routing = moe(x, return_routing=True)
    assert routing.indices.flatten().tolist() == [0, 0, 0, 1]
    torch.testing.assert_close(routing.weights, torch.ones(4, 1, dtype=torch.float64))
    torch.testing.assert_close(aux, torch.tensor(9 / 8, dtype=torch.float64))


def test_routing_replay():
    moe = randomize(MoE(16, 4, 2, expert_hidden=8, shared_expert_hidden=8))
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    y, _, routing = moe(x, return_routing=True)
    routing = routing.detach()
    again, aux, used = moe(x, routing=routing, return_routing=True)
    assert torch.equal(again, y)
    assert aux.item() == 0.0 and used is routing
    x2 = x + 2.0 * torch.randn_like(x)
    fresh, _, fresh_routing = moe(x2, return_routing=True)
    assert not torch.equal(fresh_routing.indices, routing.indices)  # the new input routes differently
    replayed = moe(x2, routing=routing)
    torch.testing.assert_close(replayed, loop_moe(moe, x2, routing))
    assert not torch.allclose(replayed, fresh)
    with pytest.raises(ValueError, match="shape"):
        moe(x[:, :3], routing=routing)


def test_gradients_reach_router_and_every_expert():
    moe = MoE(16, 4, 2, expert_hidden=8, shared_expert_hidden=8)
    x = torch.randn(4, 16, 16)
    y, aux, routing = moe(x, return_routing=True)
    assert set(routing.indices.flatten().tolist()) == {0, 1, 2, 3}
    (y.square().mean() + 0.01 * aux).backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    moe.zero_grad(set_to_none=True)
    moe(x, return_routing=True)[1].backward()
    assert moe.gate.weight.grad.abs().sum() > 0  # the balance loss alone trains the router


def test_replay_within_one_step_keeps_router_gradient():
    moe = MoE(16, 4, 2, expert_hidden=8)
    x = torch.randn(2, 8, 16)
    _, _, routing = moe(x, return_routing=True)
    moe(x * 0.5, routing=routing).sum().backward()
    assert moe.gate.weight.grad.abs().sum() > 0


def test_moe_rejects_top_k_beyond_experts():
    with pytest.raises(ValueError, match="top_k"):
        MoE(16, 2, top_k=3)
