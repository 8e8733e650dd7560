"""The torch backend's CPU fast paths (fused projections and short convs, the shifted-sum
conv: builders/fast.py) compute the same function as the plain op-per-module forms the FLOP
counter reads: equal loss and equal gradients for every tiny spec with a short-conv mixer."""
from pathlib import Path

import pytest
import torch

from builders import build_model, fast
from nas.load import load_arch, loads_arch
from spaces import arch_path
from helpers import REPO

TINY = sorted(p.stem for p in (REPO / "spaces" / "archs").glob("tiny_*.yaml"))
OTHER = """name: {kind}_conv
model: {{vocab_size: 64, width: 32, defaults: {{swiglu: {{hidden_size: 64}}}}}}
num_layers: 2
layer: {{mixer: {{kind: {kind}, num_heads: 2{extra}}}, ffn: {{kind: swiglu}}}}
loop: {{boundary: mixer, T: 2}}
"""
KINDS = {"deltanet": ", use_beta: true, use_gate: true", "kda": ", head_dim: 16"}


@pytest.mark.parametrize("name", TINY + list(KINDS))
def test_fast_paths_equal_the_reference_forms(name):
    torch.manual_seed(0)
    arch = loads_arch(OTHER.format(kind=name, extra=KINDS[name])) if name in KINDS else load_arch(arch_path(name))
    model = build_model(arch, backend="torch")
    ids = torch.randint(0, arch.model.vocab_size, (2, 19))

    def run():
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids.roll(-1, 1)).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = run()
    with fast.reference_paths():
        ref_loss, ref_grads = run()
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-6, rtol=1e-4, msg=n)
