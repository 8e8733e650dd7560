"""The compiler: every shipped spec builds; loops execute as written, with shared weights."""
from __future__ import annotations

import pytest
import torch

from builders.model import build_model
from nas.load import loads_arch
from nas.twin import unrolled_twin
from spaces import arch_names

from helpers import arch

TINY = [n for n in arch_names() if n.startswith("tiny_")]
FULL = [n for n in arch_names() if not n.startswith("tiny_")]


def _batch(vocab: int, B: int = 2, T: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


@pytest.mark.parametrize("name", TINY)
def test_tiny_forward_backward(name):
    torch.manual_seed(0)
    model = build_model(arch(name), backend="torch")
    ids, labels = _batch(model.arch.model.vocab_size)
    out = model(ids, labels=labels)
    assert out.logits.shape == (*ids.shape, model.arch.model.vocab_size)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"parameters without gradient: {missing[:5]}"


@pytest.mark.parametrize("name", FULL)
def test_full_size_builds_on_meta(name):
    model = build_model(arch(name), backend="torch", device="meta")
    assert sum(p.numel() for p in model.parameters()) > 1_000_000


@pytest.mark.parametrize("name", TINY + FULL)
def test_state_dict_loads_into_fla_backend(name):
    spec = arch(name)
    torch_model = build_model(spec, backend="torch", device="meta")
    fla_model = build_model(spec, backend="fla", device="meta")
    ours = {k: tuple(v.shape) for k, v in torch_model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in fla_model.state_dict().items()}
    assert ours == theirs
    if name.startswith("tiny_"):
        real = build_model(spec, backend="fla")
        result = real.load_state_dict(build_model(spec, backend="torch").state_dict(), strict=True)
        assert not result.missing_keys and not result.unexpected_keys


def _tied_twin(model, loops=None):
    """The explicitly unrolled spec, its modules tied to the looped model's."""
    twin_spec, sources = unrolled_twin(model.arch, loops)
    twin = build_model(twin_spec, backend="torch")
    twin.embed = model.embed
    twin.norm = model.norm
    for j, src in enumerate(sources):
        twin.layers[j].mixer_norm = model.layers[src].mixer_norm
        twin.layers[j].mixer = model.layers[src].mixer
        if twin.layers[j].has_ffn:
            twin.layers[j].ffn_norm = model.layers[src].ffn_norm
            twin.layers[j].ffn = model.layers[src].ffn
    return twin


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


TWIN_SPECS = {
    "fullloop": "tiny_fullloop",
    "mixerloop": "tiny_mixerloop",
    "selective_gdn_mixers": "tiny_selective",
}

ELR_PLAIN = """
name: elr_plain
model:
  vocab_size: 256
  width: 64
  defaults:
    gdn: {num_heads: 2, head_dim: 32, expand_v: 1}
    attn: {num_heads: 4}
    swiglu: {hidden_size: 128}
num_layers: 4
hybrid: {ratio: {attn: 1, gdn: 3}, placement: interleave}
loop: {boundary: elr, prelude: 1, recurrent: 2, coda: 1, T: 3}
"""


@pytest.mark.parametrize("case", [*TWIN_SPECS, "elr"])
def test_looped_equals_unrolled_twin(case):
    torch.manual_seed(0)
    spec = loads_arch(ELR_PLAIN) if case == "elr" else arch(TWIN_SPECS[case])
    model = build_model(spec, backend="torch").double()
    twin = _tied_twin(model).double()
    ids, labels = _batch(spec.model.vocab_size, T=19)
    out, out_twin = model(ids, labels=labels), twin(ids, labels=labels)
    torch.testing.assert_close(out.logits, out_twin.logits, rtol=1e-10, atol=1e-10)
    out.loss.backward()
    g_loop = _grads(model)
    model.zero_grad()
    out_twin.loss.backward()
    for name, g in _grads(model).items():
        torch.testing.assert_close(g, g_loop[name], rtol=1e-9, atol=1e-11)


def test_residual_gate_matches_hand_written_loop():
    """FullLoop with a non-zero ρ: h_τ = f(h_{τ-1}) + ρ_τ ⊙ h_{τ-1}."""
    torch.manual_seed(0)
    model = build_model(arch("tiny_fullloop"), backend="torch").double()
    with torch.no_grad():
        model.rho.normal_()
    ids, _ = _batch(256)
    h = model.embed(ids)
    for t in range(4):
        prev = h
        for block in model.layers:
            h = block.run_ffn(block.run_mixer(h))
        h = h + model.rho[t] * prev
    torch.testing.assert_close(model(ids).logits, model.head(model.norm(h)))


def test_elr_one_loop_equals_plain_model():
    """With zero-initialised conditioning, ELR at loops=1 is the plain model."""
    torch.manual_seed(0)
    elr = build_model(arch("tiny_elr"), backend="torch")
    plain_spec = elr.arch.model_copy(update={"loops": (), "elastic": None})
    plain = build_model(plain_spec, backend="torch")
    plain.load_state_dict({k: v for k, v in elr.state_dict().items() if not k.startswith("loops.")})
    ids, _ = _batch(256)
    torch.testing.assert_close(elr(ids, loops=1).logits, plain(ids).logits, rtol=0, atol=0)
    assert not torch.equal(elr(ids, loops=2).logits, plain(ids).logits)


def test_loop_count_override_changes_depth():
    torch.manual_seed(0)
    model = build_model(arch("tiny_mixerloop"), backend="torch")
    ids, _ = _batch(256)
    a, b = model(ids, loops=1).logits, model(ids, loops=4).logits
    assert not torch.allclose(a, b)
    torch.testing.assert_close(model(ids).logits, b)


def test_coarse_to_fine_schedule_changes_windows():
    """Iteration 0 runs full attention; later iterations the scheduled windows."""
    torch.manual_seed(0)
    model = build_model(arch("tiny_coarse_to_fine"), backend="torch")
    seen = []
    for block in model.layers:
        original = block.mixer.forward
        block.mixer.forward = (lambda f: lambda x, window=None: (seen.append(window), f(x, window=window))[1])(original)
    model(_batch(256, T=40)[0])
    assert seen == ["full", "full", 32, 32, 16, 16, 8, 8]


def test_routing_replay_reuses_first_loop_routing():
    torch.manual_seed(0)
    model = build_model(arch("tiny_moe_replay"), backend="torch")
    moe = model.layers[1].ffn
    calls = []
    original = moe.forward
    moe.forward = lambda x, routing=None, **kw: (calls.append(routing), original(x, routing=routing, **kw))[1]
    out = model(*_batch(256))
    assert calls[0] is None and all(r is not None for r in calls[1:]) and len(calls) == 3
    assert out.aux_loss is not None and torch.isfinite(out.aux_loss)


def test_random_placement_resamples_and_votes():
    spec = """
name: rnd
model: {vocab_size: 64, width: 32, defaults: {attn: {num_heads: 2}, gdn: {num_heads: 2, head_dim: 16, expand_v: 1}, swiglu: {hidden_size: 64}}}
num_layers: 5
hybrid: {ratio: {attn: 1, gdn: 4}, placement: random, eval_samples: 3}
"""
    torch.manual_seed(0)
    model = build_model(loads_arch(spec), backend="torch")
    patterns = {tuple(model._pattern()) for _ in range(20)}
    assert len(patterns) > 1 and all(sum(p) == 4 for p in patterns)  # one attn (0), four gdn (1)
    model.eval()
    probs = model(_batch(64)[0]).logits.exp().sum(-1)
    torch.testing.assert_close(probs, torch.ones_like(probs))


RANDOM = """
name: rnd
model: {vocab_size: 64, width: 32, defaults: {attn: {num_heads: 2}, gdn: {num_heads: 2, head_dim: 16, expand_v: 1}, swiglu: {hidden_size: 64}}}
num_layers: 5
hybrid: {ratio: {attn: 2, gdn: 3}, placement: random, sampling_per: %s}
"""


def _options_run(model, *args, **kw) -> tuple[int, ...]:
    """The option every switch layer ran in one forward pass."""
    seen = []
    hooks = [l.mixer.register_forward_pre_hook(lambda m, a, k: seen.append(k["option"]), with_kwargs=True)
             for l in model.layers]
    model(*args, **kw)
    for h in hooks:
        h.remove()
    return tuple(seen)


def test_random_placement_drawn_once_per_optimizer_step():
    """sampling_per: step: start_step draws one pattern (at the ratio's counts) that every
    training forward pass of the step runs, micro-batches and loop groups alike, until the
    next step; without start_step, training is a clear error."""
    arch = loads_arch(RANDOM % "step")
    assert arch.random_placement.sampling_per == "step"
    torch.manual_seed(0)
    model = build_model(arch, backend="torch").train()
    x, y = _batch(64)
    with pytest.raises(RuntimeError, match="start_step"):
        model(x, y)
    steps = []
    for step in range(6):
        pattern = model.start_step(torch.Generator().manual_seed(step))
        assert sorted(pattern) == [0, 0, 1, 1, 1]
        runs = {_options_run(model, *_batch(64, seed=s)) for s in range(3)}  # three micro-batches
        assert runs == {tuple(pattern)}
        steps.append(tuple(pattern))
    assert len(set(steps)) > 1  # each step draws afresh
    held = list(steps[-1])
    with torch.no_grad():  # the held pattern's function, exactly
        torch.testing.assert_close(model(x).logits, model.head(model.hidden(x, pattern=held)[0]), rtol=0, atol=0)


def test_random_placement_per_forward_is_the_default():
    model = build_model(loads_arch(RANDOM % "forward"), backend="torch").train()
    assert model.start_step() is None
    torch.manual_seed(0)
    runs = {_options_run(model, _batch(64)[0]) for _ in range(20)}
    assert len(runs) > 1 and all(sorted(r) == [0, 0, 1, 1, 1] for r in runs)


def test_hold_pattern_fixes_training_passes_and_restores():
    model = build_model(loads_arch(RANDOM % "step"), backend="torch").train()
    x = _batch(64)[0]
    first = model.start_step()
    other = [1, 1, 1, 0, 0]
    with model.hold_pattern(other) as held:
        assert held == other and _options_run(model, x) == tuple(other)
        with model.hold_pattern() as inner:  # drawn once on entry
            assert {_options_run(model, x) for _ in range(3)} == {tuple(inner)}
        assert _options_run(model, x) == tuple(other)
    assert _options_run(model, x) == tuple(first)
    with pytest.raises(ValueError, match="one option per layer"):
        with model.hold_pattern([0, 1]):
            pass
    plain = build_model(arch("tiny_noloop"), backend="torch")
    with pytest.raises(ValueError, match="random-placement"):
        with plain.hold_pattern([0, 0]):
            pass
