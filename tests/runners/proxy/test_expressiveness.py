"""The looped LMs users compare against, expressed in the DSL, priced, built and checked
against hand-written references: truncated backpropagation through iterations, loop-count
distributions (fixed, uniform, Huginn's Poisson with a log-normal rate) drawn per row,
micro-batch or step, re-injection from the first iteration with a zero or random initial
state, a norm after every iteration (Ouro), a per-region FFN inside the loop sugar; and
the full-size Huginn-like and Ouro-like specs at their published parameter counts."""
import math

import numpy as np
import pytest
import torch

from builders.model import build_model
from nas import load_arch, loads_arch
from nas.cost import cost
from nas.elastic import train_dist
from nas.errors import SpecError
from nas.spec import LoopDist, poisson_lognormal_pmf
from runners.elastic import draw_counts, loop_groups, step_dist
from spaces import ARCHS

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread

BASE = """
model: {vocab_size: 64, width: 32, defaults: {gdn: {num_heads: 2, head_dim: 16, expand_v: 1}, swiglu: {hidden_size: 64}}}
num_layers: 2
layer: {mixer: {kind: gdn}}
"""


def _model(loop: str, extra: str = "", seed: int = 0):
    torch.manual_seed(seed)
    arch = loads_arch(BASE + f"loop: {loop}\n" + extra)
    model = build_model(arch, backend="torch").double()
    with torch.no_grad():  # random non-zero loop parameters: every rule visibly acts
        for p in model.loops.parameters():
            p.normal_(0, 0.3)
        if hasattr(model, "rho"):
            model.rho.normal_(0, 0.3)
    return model


def _stack(model, h):
    for block in model.layers:
        h = block.run_ffn(block.run_mixer(h))
    return h


def _ids(seed: int = 1):
    return torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(seed))


def _grads(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


# ---------------------------------------------------------------- truncated backpropagation


def _truncated_reference(model, ids, k: int, n: int):
    """Residual gate + index conditioning over the whole stack, written out; the state
    entering iteration k − n is detached (only the last n iterations carry gradient)."""
    ex = model.loops[0]
    h = model.embed(ids)
    for t in range(k):
        if t == k - n:
            h = h.detach()
        out = _stack(model, h + ex.index_emb[t])
        h = out + model.rho[t] * h
    return model.head(model.norm(h)).square().mean()


@pytest.mark.parametrize("k", [None, 3, 5])
def test_truncated_gradients_equal_a_detached_reference(k):
    loop = "{boundary: block, T: 4, truncate: 2, update: {kind: residual_gate}, conditioning: index}"
    model = _model(loop, "elastic: {train: {values: [3, 5], weights: [1, 1]}, eval: [3, 4, 5]}\n")
    ids, steps = _ids(), 4 if k is None else k
    got = _grads(model, model(ids, loops=k).logits.square().mean())
    want = _grads(model, _truncated_reference(model, ids, steps, 2))
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)
    # rows used only before the last two iterations get exactly no gradient; an untruncated
    # model gives them some
    index = got["loops.0.index_emb"]
    assert torch.count_nonzero(index[: steps - 2]) == 0 and torch.count_nonzero(index[steps - 2: steps]) > 0
    full = _grads(model, _truncated_reference(model, ids, steps, steps))
    assert torch.count_nonzero(full["loops.0.index_emb"][: steps - 2]) > 0


def test_no_grad_before_the_cut_gives_the_same_gradients():
    """LoopExtras.carries_grad: an executor that runs the iterations before the cut under
    no_grad (saving their activations) gets the gradients of the detaching one."""
    from builders.model import _Run

    model = _model("{boundary: block, T: 4, truncate: 2, update: {kind: residual_gate}, conditioning: index}")
    ids = _ids()
    want = _grads(model, model(ids).logits.square().mean())
    (node,) = model.plan()
    ex, run = model.loops[0], _Run(None)
    h = e = model.embed(ids)
    for t in range(node.T):
        run.iters[node.index] = t
        with torch.set_grad_enabled(ex.carries_grad(t, node.T)):
            out = model._run(node.body, ex.enter(h, e, t, node.T), run)
            h = ex.update(h, out, t, model.rho)
    assert [ex.carries_grad(t, 4) for t in range(4)] == [False, False, True, True]
    got = _grads(model, model.head(model.norm(h)).square().mean())
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)


def _saved_bytes(model, ids) -> int:
    """Bytes autograd keeps for the backward of one forward pass."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids)
    return total


def _mixer_grad_flags(model, ids, **kw) -> list[bool]:
    """Whether layer 0's mixer output carries a graph, per application."""
    flags = []
    handle = model.layers[0].mixer.register_forward_hook(lambda m, a, out: flags.append(out.requires_grad))
    model(ids, **kw)
    handle.remove()
    return flags


def test_truncated_backward_is_priced_with_the_last_iterations_schedule():
    """Coarse-to-fine windows (full, 32, 16, 8) with truncate: 1: the backward runs through
    the last iteration only, at window 8, so training FLOPs = forward + 2 × the forward of
    one iteration at window 8 (not at the first iteration's full attention)."""
    base = """
name: c2f
model: {vocab_size: 64, width: 32, defaults: {attn: {num_heads: 2}, swiglu: {hidden_size: 64}}}
num_layers: 2
layer: {mixer: {kind: attn}, ffn: {kind: swiglu}}
loop: {boundary: block, T: 4, update: {kind: residual_gate}, windows: [full, 32, 16, 8], truncate: 1}
"""
    n = 512
    sheet = cost(loads_arch(base), seq_len=n)
    last = cost(loads_arch(base.replace("T: 4", "T: 1").replace("[full, 32, 16, 8], truncate: 1", "[8]")),
                seq_len=n)
    first = cost(loads_arch(base.replace("T: 4", "T: 1").replace("[full, 32, 16, 8], truncate: 1", "[full]")),
                 seq_len=n)
    fwd = sheet.figures.forward_flops
    assert sheet.train_flops_per_token == pytest.approx(fwd + 2 * last.figures.forward_flops, rel=1e-12)
    assert first.figures.forward_flops > last.figures.forward_flops  # the two readings differ


def test_iterations_before_the_cut_build_no_graph():
    """The executor runs the iterations before the cut without a graph: their outputs do
    not require grad, and the forward keeps the activations of a T = 2 loop, not T = 4."""
    loop = "{boundary: block, T: 4, truncate: 2, update: {kind: residual_gate}, conditioning: index}"
    cut, ids = _model(loop), _ids()
    assert _mixer_grad_flags(cut, ids) == [False, False, True, True]
    assert _mixer_grad_flags(cut, ids, loops=3) == [False, True, True]
    short, full = _model(loop.replace("T: 4, truncate: 2", "T: 2")), _model(loop.replace(", truncate: 2", ""))
    assert _mixer_grad_flags(full, ids) == [True] * 4
    assert _saved_bytes(cut, ids) == pytest.approx(_saved_bytes(short, ids), rel=1e-3)
    assert _saved_bytes(full, ids) > 1.9 * _saved_bytes(cut, ids)
    with torch.no_grad():
        assert _mixer_grad_flags(full, ids) == [False] * 4


def test_moe_iterations_before_the_cut_keep_their_graph():
    """An MoE FFN's load-balance loss in an iteration before the cut trains its router (as
    with the detached state alone), so such a region keeps the graph of every iteration;
    dropping it would change the router's gradient."""
    model = _model("{boundary: block, T: 3, truncate: 1, ffn: {kind: moe, num_experts: 4, top_k: 2, expert_hidden: 16}}")
    ids = _ids()
    assert _mixer_grad_flags(model, ids) == [True] * 3
    want = _grads(model, model(ids, labels=ids).loss)
    model._graphless_cut = (True,)
    assert _mixer_grad_flags(model, ids) == [False, False, True]
    got = _grads(model, model(ids, labels=ids).loss)
    router = "layers.0.ffn.gate.weight"
    assert not torch.allclose(got[router], want[router])


def test_truncation_keeps_the_reinjected_input_gradient():
    """Huginn: the prelude trains through the input re-injected into the last iterations."""
    loop = ("{boundary: elr, prelude: 1, recurrent: 1, coda: 0, T: 4, truncate: 1, "
            "update: {kind: reinject, mode: add}}")
    model = _model(loop)
    g = _grads(model, model(_ids()).logits.square().mean())
    assert g["layers.0.mixer.q_proj.weight"].abs().sum() > 0
    plain = _model(loop.replace("reinject, mode: add", "plain"))
    g = _grads(plain, plain(_ids()).logits.square().mean())
    assert g["layers.0.mixer.q_proj.weight"].abs().sum() == 0  # no path: nothing reaches the prelude


def test_truncation_is_priced_as_a_shorter_backward():
    """Training FLOPs: a forward at T plus a backward (2 × forward) through the last n
    iterations, i.e. through the same spec looped n times; untruncated it is 3 × forward."""
    spec = BASE + "loop: {boundary: block, T: 6, truncate: 2, update: {kind: gated_step}}\n"
    truncated, short = loads_arch(spec), loads_arch(spec.replace("T: 6, truncate: 2", "T: 2"))
    full = loads_arch(spec.replace(", truncate: 2", ""))
    fwd = cost(truncated).figures.forward_flops
    assert fwd == cost(full).figures.forward_flops
    assert cost(truncated).train_flops_per_token == pytest.approx(fwd + 2 * cost(short).figures.forward_flops)
    assert cost(full).train_flops_per_token == 3 * fwd


def test_truncate_must_cut_something():
    with pytest.raises(SpecError) as exc:
        loads_arch(BASE + "loop: {boundary: block, T: 3, truncate: 3}\n")
    (problem,) = exc.value.problems
    assert problem.path == "loop.truncate" and "keeps the gradient of every iteration" in problem.message


# ---------------------------------------------------------------- loop-count distributions


def test_distribution_kinds_tabulate_exactly():
    assert LoopDist(kind="fixed", k=3).values == (3,)
    u = LoopDist(kind="uniform", low=2, high=5)
    assert u.values == (2, 3, 4, 5) and u.weights == (0.25,) * 4
    p = LoopDist(kind="poisson_lognormal", mean=4, sigma=0.5, max=12)
    assert p.values == tuple(range(1, 13)) and sum(p.weights) == pytest.approx(1, abs=1e-12)
    assert LoopDist.model_validate(p.model_dump()) == p  # a dumped table reloads
    # σ = 0: exactly 1 + Poisson(mean), the tail clamped at max
    zero = LoopDist(kind="poisson_lognormal", mean=3, sigma=0, max=6).weights
    pois = [math.exp(-3) * 3 ** j / math.factorial(j) for j in range(5)]
    assert zero == pytest.approx((*pois, 1 - sum(pois)), abs=1e-12)


def test_poisson_lognormal_matches_huginns_generative_draw():
    """τ ~ N(log r̄ − σ²/2, σ), k = min(Poisson(e^τ) + 1, max), sampled directly."""
    rng = np.random.default_rng(0)
    mean, sigma, top, n = 6.0, 0.5, 16, 400_000
    tau = rng.normal(math.log(mean) - sigma ** 2 / 2, sigma, n)
    k = np.minimum(rng.poisson(np.exp(tau)) + 1, top)
    freq = np.bincount(k, minlength=top + 1)[1:] / n
    pmf = np.array(poisson_lognormal_pmf(mean, sigma, top))
    assert np.abs(freq - pmf).max() < 4 * math.sqrt(0.25 / n)
    assert (pmf * np.arange(1, top + 1)).sum() == pytest.approx(mean + 1, rel=0.02)  # E[e^τ] = r̄, less the clamp


@pytest.mark.parametrize("bad, message", [
    ({"kind": "fixed"}, "kind fixed needs k; missing k"),
    ({"kind": "uniform", "low": 5, "high": 2}, "1 <= low <= high"),
    ({"kind": "fixed", "k": 2, "mean": 3}, "mean do not apply to kind fixed"),
    ({"kind": "uniform", "low": 1, "high": 2, "values": [1, 3]}, "follow from kind uniform"),
])
def test_bad_distributions_name_the_field(bad, message):
    with pytest.raises(SpecError) as exc:
        loads_arch(BASE + "loop: {boundary: block, T: 2}\nelastic: {train: %s}\n"
                   % str(bad).replace("'", ""))
    (problem,) = exc.value.problems
    assert problem.path == "elastic.train" and message in problem.message


def test_draws_per_row_micro_batch_and_step():
    gen = torch.Generator().manual_seed(0)
    dist = LoopDist(kind="uniform", low=1, high=4)
    rows = loop_groups(dist, 64, gen)
    assert sorted(torch.cat([r for _, r in rows]).tolist()) == list(range(64)) and len(rows) > 1
    per_micro = dist.model_copy(update={"per": "micro_batch"})
    ((k, everything),) = loop_groups(per_micro, 64, gen)
    assert everything is None and 1 <= k <= 4
    per_step = dist.model_copy(update={"per": "step"})
    with pytest.raises(ValueError, match="step_dist"):
        loop_groups(per_step, 64, gen)
    # the trainer's step: one draw, every micro-batch of the step runs it
    counts = []
    for _ in range(2000):
        step = step_dist(per_step, gen)
        micro = [loop_groups(step, 8, gen) for _ in range(3)]
        assert len({g[0][0] for g in micro}) == 1 and all(g[0][1] is None for g in micro)
        counts.append(micro[0][0][0])
    freq = np.bincount(counts, minlength=5)[1:] / len(counts)
    assert np.abs(freq - 0.25).max() < 4 * math.sqrt(0.25 / len(counts))


def test_expected_training_compute_is_what_the_sampler_runs():
    """tiny_huginn: the cost model's training FLOPs per token are the mean, over loop
    counts drawn as the trainer draws them, of forward + truncated backward."""
    arch = load_arch(ARCHS / "tiny_huginn.yaml")
    sheet = cost(arch)
    dist = train_dist(arch, 0, 10)
    assert dist == arch.elastic.train and dist.per == "micro_batch"
    gen = torch.Generator().manual_seed(0)
    ks = [loop_groups(dist, 4, gen)[0][0] for _ in range(4000)]

    def looped(k: int) -> float:  # forward FLOPs of the spec looped k times, untruncated
        region = arch.loops[0].model_copy(update={"T": k, "truncate": None})
        return cost(arch.model_copy(update={"loops": (region,), "elastic": None})).figures.forward_flops

    per_k = {k: looped(k) + 2 * looped(min(k, 2)) for k in set(ks)}
    samples = np.array([per_k[k] for k in ks])
    assert abs(samples.mean() - sheet.train_flops_per_token) < 4 * samples.std() / math.sqrt(len(ks))


# ---------------------------------------------------------------- re-injection from the first iteration


def _reinject_reference(model, ids, k: int, s0: torch.Tensor):
    ex = model.loops[0]
    e = h = model.embed(ids)
    h = s0
    for t in range(k):
        h = _stack(model, torch.cat([h, e], -1) @ ex.reinject.weight.T)
    return model.head(model.norm(h))


@pytest.mark.parametrize("initial", ["zeros", "random"])
def test_reinjection_from_the_first_iteration(initial):
    loop = f"{{boundary: block, T: 3, update: {{kind: reinject, mode: concat, initial_state: {initial}, init_std: 0.7}}}}"
    model = _model(loop)
    ids = _ids()
    torch.manual_seed(5)
    got = model(ids).logits
    e = model.embed(ids)
    torch.manual_seed(5)
    s0 = torch.zeros_like(e) if initial == "zeros" else torch.randn_like(e) * 0.7
    torch.testing.assert_close(got, _reinject_reference(model, ids, 3, s0), rtol=1e-10, atol=1e-10)
    torch.manual_seed(6)
    assert torch.equal(model(ids).logits, got) == (initial == "zeros")


def test_reinjection_every_iteration_is_priced_every_iteration():
    """The concat adapter runs T times per forward from the first iteration, T − 1 times
    from the input."""
    spec = BASE + "loop: {boundary: block, T: 3, update: {kind: reinject, mode: concat, initial_state: zeros}}\n"
    d = 32
    every = cost(loads_arch(spec)).figures.extras
    later = cost(loads_arch(spec.replace(", initial_state: zeros", ""))).figures.extras
    assert [e.flops for e in every] == [3 * 4 * d * d] and [e.flops for e in later] == [2 * 4 * d * d]


# ---------------------------------------------------------------- a norm after every iteration


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_iteration_norm_matches_a_hand_written_loop(norm):
    model = _model("{boundary: block, T: 3, iteration_norm: true, update: {kind: gated_step}}",
                   extra="", seed=0) if norm == "rmsnorm" else None
    if model is None:
        torch.manual_seed(0)
        arch = loads_arch(BASE.replace("width: 32,", f"width: 32, norm: {{kind: {norm}}},")
                          + "loop: {boundary: block, T: 3, iteration_norm: true, update: {kind: gated_step}}\n")
        model = build_model(arch, backend="torch").double()
        with torch.no_grad():
            for p in model.loops.parameters():
                p.normal_(0, 0.3)
    ex, ids = model.loops[0], _ids()
    assert type(ex.norm).__name__ == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[norm]
    h = model.embed(ids)
    for t in range(3):
        out = _stack(model, h)
        if t > 0:
            g = torch.sigmoid(torch.cat([h, out], -1) @ ex.gate.weight.T + ex.gate.bias)
            out = h + g * (out - h)
        h = ex.norm(out)
    torch.testing.assert_close(model(ids).logits, model.head(model.norm(h)), rtol=1e-10, atol=1e-10)
    assert model.arch.loops[0].iteration_norm.kind == norm  # the model's own norm kind


# ---------------------------------------------------------------- per-region FFN in the sugar


def test_loop_ffn_puts_moe_only_in_the_recurrent_block():
    arch = load_arch(ARCHS / "tiny_elr_moe.yaml")
    assert [l.ffn.kind for l in arch.layers] == ["swiglu", "moe", "moe", "swiglu"]
    moe = arch.layers[1].ffn
    assert (moe.num_experts, moe.top_k, moe.expert_hidden) == (4, 2, 64)  # model.defaults.moe applied
    assert arch.loops[0].routing_replay  # valid only because the loop now holds MoE FFNs
    model = build_model(arch, backend="torch")
    out = model(_ids() % 64, labels=_ids() % 64)
    assert torch.isfinite(out.loss) and out.aux_loss is not None


def test_loop_ffn_errors_name_the_sugar_field():
    with pytest.raises(SpecError) as exc:
        loads_arch(BASE + "loop: {boundary: block, T: 2, ffn: {kind: moe, num_experts: 2, top_k: 3}}\n")
    assert exc.value.problems[0].path.startswith("loop.ffn")


# ---------------------------------------------------------------- full-size published shapes


def test_huginn_like_parameters():
    """Huginn-0125: width E = 5280 (55 heads of 96, MHA), SwiGLU inner I = 17920, vocab
    V = 65536 tied, 2 + 4 + 2 layers, a bias-free concat adapter (2E → E). Per layer:
    attention 4E², SwiGLU 3EI, two norms 2E; plus the adapter 2E², the embedding VE and the
    final norm E: 3,564,807,840, the "3.5B" of the paper (Huginn's two extra sandwich
    norms per layer add 84,480)."""
    arch = load_arch(ARCHS / "huginn_like.yaml")
    E, I, V = 5280, 17920, 65536
    sheet = cost(arch)
    assert sheet.unique_params == 8 * (4 * E * E + 3 * E * I + 2 * E) + 2 * E * E + V * E + E == 3_564_807_840
    assert abs(sheet.unique_params / 3.5e9 - 1) < 0.02
    assert arch.elastic.train.per == "step" and arch.loops[0].truncate == 8
    assert sheet.per_k[-1].loops == 64


def test_ouro_like_parameters():
    """Ouro-1.4B: 24 layers, width 2048 (16 MHA heads), SwiGLU 5632, vocab 49152, untied
    head: 24 (4d² + 3·d·5632 + 2d) + 2Vd + d (final norm) + d (iteration norm) =
    1,434,554,368, the model card's 1.4B."""
    arch = load_arch(ARCHS / "ouro_like.yaml")
    d, I, V = 2048, 5632, 49152
    n = cost(arch).unique_params
    assert n == 24 * (4 * d * d + 3 * d * I + 2 * d) + 2 * V * d + 2 * d == 1_434_554_368
    assert abs(n / 1.4e9 - 1) < 0.025


def test_tiny_huginn_trains_end_to_end():
    from runners.train import TrainConfig, train

    arch = load_arch(ARCHS / "tiny_huginn.yaml")
    cfg = TrainConfig(task="mqar", task_params={"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2}, steps=3,
                      batch_size=4, warmup_steps=1, eval_every=3, eval_batches=1, progress=False)
    result = train(arch, cfg)
    assert result.status == "ok" and sum(result.depth_rows.values()) == 3 * 4
    assert all(int(k) in arch.elastic.train.values for k in result.depth_rows)
    assert [p.k for p in result.elastic] == [1, 2, 4, 8]


def test_draw_counts_follow_the_table():
    gen = torch.Generator().manual_seed(1)
    dist = LoopDist(kind="poisson_lognormal", mean=3, sigma=0.3, max=8)
    ks = draw_counts(dist, 20000, gen)
    freq = np.bincount(ks, minlength=9)[1:] / len(ks)
    assert np.abs(freq - np.array(dist.weights)).max() < 4 * math.sqrt(0.25 / len(ks))
