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


# ---------------------------------------------------------------- one registration per rule

OPTIONS = {
    "iteration_norm": "{kind: residual_gate, shared: false}, iteration_norm: true",
    "from_first": "{kind: reinject, mode: diagonal, initial_state: zeros}, conditioning: index_budget",
}


def test_every_rule_is_registered_once_on_both_sides():
    """Each update-rule kind of the spec union and each region option has exactly one
    spec-side entry (parameters, cost, graph, label) and one executor entry, under the
    same key; registering a key again is refused."""
    import typing

    from builders import rules as executors
    from nas import rules
    from nas.spec import UpdateRule

    kinds = {c.model_fields["kind"].default for c in typing.get_args(typing.get_args(UpdateRule)[0])}
    assert set(rules.UPDATES) == kinds
    assert set(executors.RULES) == kinds | set(rules.OPTIONS)
    with pytest.raises(ValueError, match="already registered"):
        rules.register_update("plain")(rules.Rule)
    with pytest.raises(ValueError, match="already registered"):
        executors.register("conditioning")(executors.LoopRule)


@pytest.mark.parametrize("rule", {**RULES, **OPTIONS})
def test_rule_parameters_are_counted_exactly(rule):
    """The cost sheet's extras (from each rule's module) are the built model's loop
    parameters, name by name and size by size."""
    from nas.cost import cost

    update = {**RULES, **OPTIONS}[rule]
    arch = loads_arch(BASE + f"loop: {{boundary: block, T: {T}, update: {update}}}\n")
    model = build_model(arch, backend="torch", device="meta")
    params = {n: p.numel() for n, p in model.named_parameters() if n.startswith(("loops.", "rho"))}
    sheet = cost(arch)
    owned = {e.name: sum(v for n, v in params.items() if n == e.name or n.startswith(e.name + "."))
             for e in sheet.figures.extras}
    assert owned == {e.name: e.params for e in sheet.figures.extras}
    assert sum(owned.values()) == sum(params.values())
    assert sheet.unique_params == sum(p.numel() for p in model.parameters())
