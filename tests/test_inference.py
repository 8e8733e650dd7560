"""Incremental decoding: prefill + decode reproduce the whole-sequence forward."""
from __future__ import annotations

import pytest
import torch

from builders.model import build_model
from nas.load import load_arch
from spaces import ARCHS

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(arch, seed: int = 0) -> torch.nn.Module:
    """A float64 model whose loop extras (ρ, gates, re-injection, conditioning) are random
    and non-zero, so loops are not plain composition."""
    torch.manual_seed(seed)
    model = build_model(arch, backend="torch").double().eval()
    with torch.no_grad():
        for p in [*model.loops.parameters(), *([model.rho] if hasattr(model, "rho") else [])]:
            p.normal_(0.0, 0.3)
    return model


def _full_logits(model, ids, loops=None, pattern=None):
    with torch.no_grad():
        return model.head(model.hidden(ids, loops, pattern)[0])


def _decoded_logits(model, ids, prompt: int, step: int = 1, **kw):
    logits, cache = model.prefill(ids[:, :prompt], **kw)
    outs = [logits]
    for s in range(prompt, ids.shape[1], step):
        outs.append(model.decode(cache, ids[:, s:s + step]))
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("name", ["tiny_noloop", "tiny_fullloop", "tiny_mixerloop"])
def test_gdn_decode_matches_forward(name):
    model = _model(load_arch(ARCHS / f"{name}.yaml"))
    ids = torch.randint(0, model.arch.model.vocab_size, (2, 21), generator=torch.Generator().manual_seed(1))
    decoded, cache = _decoded_logits(model, ids, prompt=9)
    torch.testing.assert_close(decoded, _full_logits(model, ids), rtol=0, atol=1e-10)
    assert cache.pos == 21


def test_greedy_generate_is_the_argmax_rollout():
    model = _model(load_arch(ARCHS / "tiny_mixerloop.yaml"))
    prompt = torch.randint(0, model.arch.model.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, max_new_tokens=6)
    ids = prompt
    for _ in range(6):
        ids = torch.cat([ids, _full_logits(model, ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)
