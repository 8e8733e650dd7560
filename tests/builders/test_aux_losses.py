"""Auxiliary losses reach the loss wherever their op sits: a DSA indexer learns only from
its distillation loss, inside a parallel mixer or a switch option as much as on its own.
They are returned from forward (builders.registry.call_op), never left on module
attributes, so activation checkpointing recomputes them with the rest."""
import pytest
import torch

from builders.model import build_model
from nas import loads_arch

DSA = "{kind: dsa, num_heads: 2, index_heads: 2, index_head_dim: 8, topk: 4}"
GDN = "{kind: gdn, num_heads: 2, head_dim: 16, expand_v: 1}"
BASE = "model: {vocab_size: 64, width: 32, defaults: {swiglu: {hidden_size: 64}}}\nnum_layers: 2\n"
SPECS = {
    "parallel-concat": BASE + f"layer: {{mixer: {{kind: parallel, combine: concat, branches: [{DSA}, {GDN}]}}}}\n",
    "parallel-mean": BASE + f"layer: {{mixer: {{kind: parallel, branches: [{DSA}, {GDN}]}}}}\n"
                            "loop: {boundary: mixer, T: 2, update: {kind: reinject, mode: add}}\n",
    "switch": BASE + f"hybrid: {{ratio: {{d: 1, g: 1}}, placement: random, mixers: {{d: {DSA}, g: {GDN}}}}}\n",
}


@pytest.mark.parametrize("name", SPECS)
def test_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    model = build_model(loads_arch(SPECS[name])).train()
    ids = torch.randint(0, 64, (2, 12))
    patterns = ([0, 1], [1, 0]) if name == "switch" else (None,)
    for pattern in patterns:  # each option of each switch layer runs once
        model._pattern = lambda: pattern
        out = model(ids, labels=ids)
        assert out.aux_loss is not None and out.aux_loss.requires_grad
        out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_aux_loss_is_the_indexer_loss_of_the_leaf_that_ran():
    """A switch runs one option; only that option's indexer loss enters."""
    model = build_model(loads_arch(SPECS["switch"])).train()
    ids = torch.randint(0, 64, (2, 12))
    model._pattern = lambda: [1, 1]  # GDN everywhere: no DSA ran
    assert model(ids, labels=ids).aux_loss is None
    model._pattern = lambda: [0, 1]
    assert model(ids, labels=ids).aux_loss is not None


@pytest.mark.parametrize("name", SPECS)
def test_aux_losses_survive_activation_checkpointing(name):
    """Every block run under torch.utils.checkpoint (recomputed in the backward): the same
    loss and the same gradients, indexer included, as the plain forward."""
    from torch.utils.checkpoint import checkpoint

    from builders.model import Block

    torch.manual_seed(0)
    model = build_model(loads_arch(SPECS[name])).double().train()
    ids = torch.randint(0, 64, (2, 12))
    pattern = [0, 1] if name == "switch" else None
    model._pattern = lambda: pattern

    def grads():
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.aux_loss.detach(), {n: p.grad for n, p in model.named_parameters()}  # None: option not run

    plain_aux, plain = grads()
    mixer_step = Block.mixer_step
    Block.mixer_step = lambda self, h, **kw: checkpoint(mixer_step, self, h, use_reentrant=False, **kw)
    try:
        ckpt_aux, ckpt = grads()
    finally:
        Block.mixer_step = mixer_step
    torch.testing.assert_close(ckpt_aux, plain_aux, rtol=0, atol=0)
    assert plain.keys() == ckpt.keys()
    for n in plain:
        assert (ckpt[n] is None) == (plain[n] is None), n
        if plain[n] is not None:
            torch.testing.assert_close(ckpt[n], plain[n], rtol=1e-12, atol=1e-12, msg=n)
    assert any(n.endswith("indexer.q_proj.weight") and g is not None and g.abs().sum() > 0
               for n, g in ckpt.items())
