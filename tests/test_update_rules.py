"""Each cross-loop update rule against a hand-written loop with random non-zero loop
parameters (the twin tests run ρ = 0 and plain composition): ELR's gated step, Huginn-style
re-injection (add, concat, diagonal) and ELR's index / index+budget conditioning."""
import pytest
import torch
import torch.nn.functional as F

from builders.model import build_model
from nas import loads_arch

T = 3
BASE = """
model: {vocab_size: 64, width: 32, defaults: {gdn: {num_heads: 2, head_dim: 16, expand_v: 1}, swiglu: {hidden_size: 64}}}
num_layers: 2
layer: {mixer: {kind: gdn}}
"""
RULES = {
    "gated_step": "{kind: gated_step}",
    "reinject-add": "{kind: reinject, mode: add}",
    "reinject-concat": "{kind: reinject, mode: concat}",
    "reinject-diagonal": "{kind: reinject, mode: diagonal}",
    "cond-index": "{kind: plain}, conditioning: index",
    "cond-index_budget": "{kind: gated_step}, conditioning: index_budget",
}


def stack(model, h):
    for block in model.layers:
        h = block.run_ffn(block.run_mixer(h))
    return h


def reference(model, ids, k: int):
    """The update rules as the spec's docstrings write them, over the whole stack."""
    ex, region = model.loops[0], model.arch.loops[0]
    e = h = model.embed(ids)
    for t in range(k):
        prev, x = h, h
        if region.update.kind == "reinject" and t > 0:
            mode = region.update.mode
            if mode == "add":
                x = x + e
            elif mode == "concat":
                x = torch.cat([x, e], -1) @ ex.reinject.weight.T
            else:
                x = torch.exp(-F.softplus(ex.reinject_a)) * x + ex.reinject_b * e
        if region.conditioning != "none":
            x = x + ex.index_emb[t]
        if region.conditioning == "index_budget":
            x = x + ex.budget_emb[k - 1]
        out = stack(model, x)
        if region.update.kind == "gated_step" and t > 0:
            g = torch.sigmoid(torch.cat([prev, out], -1) @ ex.gate.weight.T + ex.gate.bias)
            h = prev + g * (out - prev)
        else:
            h = out
    return model.head(model.norm(h))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("k", [None, 2])
def test_rule_matches_hand_written_loop(rule, k):
    torch.manual_seed(0)
    arch = loads_arch(BASE + f"loop: {{boundary: block, T: {T}, update: {RULES[rule]}}}\n")
    model = build_model(arch, backend="torch").double()
    loop_params = dict(model.loops[0].named_parameters())
    assert bool(loop_params) == (rule != "reinject-add")
    with torch.no_grad():
        for p in loop_params.values():
            p.normal_(0, 0.3)
    ids = torch.randint(0, 64, (2, 11))
    got = model(ids, loops=k).logits
    want = reference(model, ids, T if k is None else k)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if loop_params:  # and the parameters matter
        with torch.no_grad():
            for p in loop_params.values():
                p.add_(0.5)
        assert not torch.allclose(model(ids, loops=k).logits, got)
