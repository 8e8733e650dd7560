"""Incremental decoding: prefill + decode reproduce the whole-sequence forward.

For every mixer kind and every loop form, the logits of ``prefill(prompt)`` followed by
token-by-token (or chunked) ``decode`` equal ``forward`` on the whole sequence, in float64
to 1e-10. Loop extras (ρ, gates, re-injection, conditioning) are random and non-zero, so a
loop is not plain composition. ``last_loop`` is checked against an explicit whole-sequence
implementation of the policy.
"""
from __future__ import annotations

import pytest
import torch

from builders.layers import attention as attn_layers
from builders.model import build_model
from builders.ops.attention import attention, masked_attention
from nas.load import load_arch, resolve, spec_from_dict
from nas.plan import applications
from nas.spec import AttnSpec
from spaces import ARCHS

pytestmark = pytest.mark.usefixtures("one_thread")

EXACT = dict(rtol=0, atol=1e-10)
V = 64

GDN = {"kind": "gdn", "num_heads": 2, "head_dim": 16, "expand_v": 1}
ATTN = {"kind": "attn", "num_heads": 4, "num_kv_heads": 2, "output_gate": True}
MIXERS = {
    "gdn": GDN,
    "kda": {"kind": "kda", "num_heads": 2, "head_dim": 16},
    "deltanet": {"kind": "deltanet", "num_heads": 2},
    "mamba2": {"kind": "mamba2", "head_dim": 16, "state_size": 8, "n_groups": 2, "chunk_size": 8},
    "attn": ATTN,
    "swa": {"kind": "attn", "num_heads": 2, "window": 5},
    "dsa": {"kind": "dsa", "num_heads": 2, "index_heads": 2, "index_head_dim": 8, "topk": 5},
    "nsa": {"kind": "nsa", "num_heads": 4, "num_kv_heads": 1, "head_dim": 8, "block_size": 4,
            "block_counts": 2, "window": 6},
    "parallel": {"kind": "parallel", "combine": "concat",
                 "branches": [{"kind": "attn", "num_heads": 2, "window": 5}, GDN]},
}
SWIGLU = {"kind": "swiglu", "hidden_size": 64}
MOE = {"kind": "moe", "num_experts": 4, "top_k": 2, "expert_hidden": 32, "shared_expert_hidden": 32}


def _arch(layers: int = 2, mixer=GDN, ffn=SWIGLU, **extra):
    data = {"model": {"vocab_size": V, "width": 32}, "num_layers": layers,
            "layer": {"mixer": mixer, "ffn": ffn}, **extra}
    return resolve(spec_from_dict(data))


def _hybrid(layers: int = 3, ffn=SWIGLU, **extra):
    """attn:gdn 1:2 interleaved (gdn, gdn, attn), so loops hold both kinds."""
    return _arch(layers, ffn=ffn, hybrid={"ratio": {"gdn": 2, "attn": 1}, "placement": "interleave",
                                          "mixers": {"gdn": GDN, "attn": ATTN}}, **extra)


def _model(arch, seed: int = 0, dtype=torch.float64):
    """A model whose loop extras (ρ, gates, re-injection, conditioning) are random and
    non-zero, so loops are not plain composition."""
    torch.manual_seed(seed)
    model = build_model(arch, backend="torch").to(dtype).eval()
    with torch.no_grad():
        for p in [*model.loops.parameters(), *([model.rho] if hasattr(model, "rho") else [])]:
            p.normal_(0.0, 0.3)
    return model


def _ids(B: int = 2, T: int = 19, seed: int = 1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def _full_logits(model, ids, loops=None, pattern=None):
    with torch.no_grad():
        return model.head(model.hidden(ids, loops, pattern)[0])


def _decoded(model, ids, prompt: int, step: int = 1, **kw):
    logits, cache = model.prefill(ids[:, :prompt], **kw)
    outs = [logits]
    for s in range(prompt, ids.shape[1], step):
        outs.append(model.decode(cache, ids[:, s:s + step]))
    return torch.cat(outs, dim=1), cache


def _check(model, ids=None, loops=None, pattern=None, kv_policy=None):
    """Token-by-token decode and chunked prefill (chunks of 4) equal the forward."""
    ids = _ids() if ids is None else ids
    full = _full_logits(model, ids, loops, pattern)
    for prompt, step in ((7, 1), (4, 4)):
        out, cache = _decoded(model, ids, prompt, step, loops=loops, pattern=pattern, kv_policy=kv_policy)
        torch.testing.assert_close(out, full, **EXACT)
        assert cache.pos == ids.shape[1]


# ---------------------------------------------------------------- mixers, no loop


@pytest.mark.parametrize("kind", sorted(MIXERS))
def test_every_mixer_decodes_like_the_forward(kind):
    _check(_model(_arch(mixer=MIXERS[kind])))


def test_switch_decodes_with_one_fixed_pattern():
    """Random placement: one pattern for the whole session; given or sampled once."""
    arch = _arch(4, hybrid={"ratio": {"gdn": 1, "attn": 1}, "placement": "random",
                            "mixers": {"gdn": GDN, "attn": ATTN}},
                 loop={"boundary": "mixer", "T": 2, "update": {"kind": "residual_gate"}})
    model = _model(arch)
    for pattern in ([0, 1, 1, 0], [1, 0, 0, 1]):
        _check(model, pattern=pattern)
    _, cache = model.prefill(_ids()[:, :5])
    assert sorted(cache.pattern) == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="pattern"):
        model.prefill(_ids()[:, :5], pattern=[0, 1, 2, 0])


# ---------------------------------------------------------------- loop forms

LOOPS = {
    "block": dict(loop={"boundary": "block", "T": 3, "update": {"kind": "residual_gate", "shared": True}}),
    "mixer": dict(loop={"boundary": "mixer", "T": 3, "update": {"kind": "residual_gate", "shared": False}}),
    "ffn": dict(loop={"boundary": "ffn", "T": 2}),
    "selective_gdn": dict(loop={"boundary": "selective", "T": 3, "select": {"ops": ["mixer"], "kinds": ["gdn"]}}),
    "selective_span": dict(loop={"boundary": "selective", "T": 2, "unit": "span",
                                 "select": {"ops": ["mixer", "ffn"], "layers": [0, 1]}}),
    "gated_step_index_budget": dict(loop={"boundary": "block", "T": 3, "update": {"kind": "gated_step"},
                                          "conditioning": "index_budget"}),
    "reinject_add_index": dict(loop={"boundary": "block", "T": 2, "update": {"kind": "reinject", "mode": "add"},
                                     "conditioning": "index"}),
    "reinject_concat": dict(loop={"boundary": "mixer", "T": 2, "update": {"kind": "reinject", "mode": "concat"}}),
    "reinject_diagonal": dict(loop={"boundary": "block", "T": 2, "update": {"kind": "reinject", "mode": "diagonal"}}),
    "nested": dict(loop=[{"boundary": "block", "T": 2}, {"boundary": "mixer", "T": 2,
                                                         "update": {"kind": "residual_gate"}}]),
    "schedule": dict(loop={"boundary": "block", "T": 3, "windows": ["full", 6, 3]}),
}


@pytest.mark.parametrize("form", sorted(LOOPS))
def test_every_loop_form_decodes_like_the_forward(form):
    _check(_model(_hybrid(**LOOPS[form])))


def _elr(ffn=SWIGLU, **loop):
    """prelude 1, recurrent 2 (gdn, attn), coda 1; gated step, index+budget conditioning."""
    return _arch(4, ffn=ffn, hybrid={"ratio": {"gdn": 3, "attn": 1}, "placement": ["gdn", "gdn", "attn", "gdn"],
                                     "mixers": {"gdn": GDN, "attn": ATTN}},
                 loop={"boundary": "elr", "prelude": 1, "recurrent": 2, "coda": 1, "T": 3,
                       "update": {"kind": "gated_step"}, "conditioning": "index_budget", **loop},
                 elastic={"eval": [1, 2, 3, 4], "train": {"values": [1, 4], "weights": [1, 1]}})


@pytest.mark.parametrize("loops", [None, 1, 2, 4])
def test_elr_elastic_loop_counts_decode_like_the_forward(loops):
    _check(_model(_elr()), loops=loops, kv_policy="per_loop")


def test_moe_routing_replay_decodes_like_the_forward():
    """Later loops replay the first loop's routing of the new tokens, as in forward."""
    model = _model(_arch(3, ffn=MOE, loop={"boundary": "elr", "prelude": 1, "recurrent": 1, "coda": 1, "T": 3,
                                            "update": {"kind": "reinject", "mode": "diagonal"},
                                            "routing_replay": True}))
    _check(model)
    moe, calls = model.layers[1].ffn, []
    original = moe.forward
    moe.forward = lambda x, routing=None, **kw: (calls.append(routing), original(x, routing=routing, **kw))[1]
    _, cache = model.prefill(_ids()[:, :6])
    calls.clear()
    model.decode(cache, _ids()[:, 6:7])
    assert calls[0] is None and len(calls) == 3  # the first loop routes the new token ...
    assert all(r is not None and r.indices.shape[0] == 2 for r in calls[1:])  # ... the later ones replay it


@pytest.mark.parametrize("name", sorted(p.stem for p in ARCHS.glob("tiny_*.yaml")))
def test_shipped_tiny_specs_decode_like_the_forward(name):
    arch = load_arch(ARCHS / f"{name}.yaml")
    _check(_model(arch), ids=torch.randint(0, arch.model.vocab_size, (2, 13),
                                           generator=torch.Generator().manual_seed(3)), kv_policy="per_loop")


# ---------------------------------------------------------------- last_loop KV policy


class _LastLoopReference(torch.nn.Module):
    """Whole-sequence ``last_loop`` for one attention layer, written independently of the
    cache, for tokens fed in chunks (``chunk[s]``: the call position s arrives in). A query
    of a non-final application attends to the *final* application's keys and values of
    the earlier chunks (``k_fin``, ``v_fin``, from the previous pass) and to its own
    application's keys of its chunk up to itself; the final application is plain causal
    attention and refreshes ``k_fin``, ``v_fin``. A chunk is exact once the earlier ones
    are, so repeating the forward until nothing changes gives the policy."""

    def __init__(self, layer, apps: int, chunk: torch.Tensor):
        super().__init__()
        self.layer, self.apps, self.chunk, self.calls = layer, apps, chunk, 0
        self.k_fin = self.v_fin = None

    def forward(self, x, window=None):
        final = self.calls % self.apps == self.apps - 1
        self.calls += 1
        q, k, v = self.layer.project(x)
        w = attn_layers.resolve_window(self.layer.window_size, window)
        if final:
            self.k_fin, self.v_fin = k, v
            return self.layer.output(x, attention(q, k, v, window=w))
        T = x.shape[1]
        k_fin = torch.zeros_like(k) if self.k_fin is None else self.k_fin
        v_fin = torch.zeros_like(v) if self.v_fin is None else self.v_fin
        s, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        seen = (j <= s) & (s - j < (w or T + 1))
        earlier = self.chunk[j] < self.chunk[s]
        mask = torch.cat([seen & earlier, seen & ~earlier], dim=1)  # (T, 2T): final keys | own keys
        o = masked_attention(q, torch.cat([k_fin, k], 1), torch.cat([v_fin, v], 1), mask)
        return self.layer.output(x, o)


def _last_loop_reference(model, ids, prompt: int, step: int, loops=None):
    T = ids.shape[1]
    chunk = torch.tensor([0 if s < prompt else 1 + (s - prompt) // step for s in range(T)])
    counts = applications(model.arch, loops)
    refs = {i: _LastLoopReference(b.mixer, counts[next(a for a in counts if a.layer == i and a.op == "mixer")], chunk)
            for i, b in enumerate(model.layers) if isinstance(model.arch.layers[i].mixer, AttnSpec)}
    originals = {i: model.layers[i].mixer for i in refs}
    try:
        for i, ref in refs.items():
            model.layers[i].mixer = ref
        prev = None
        for _ in range(T + 1):
            out = _full_logits(model, ids, loops)
            if prev is not None and torch.equal(out, prev):
                return out
            prev = out
        raise AssertionError("the last_loop reference did not settle")
    finally:
        for i, mixer in originals.items():
            model.layers[i].mixer = mixer


@pytest.mark.parametrize("loops", [2, 4])
def test_last_loop_equals_its_whole_sequence_definition(loops):
    """T > 1, an attention layer in the recurrent block: the prompt runs as in forward
    (its tokens see each other's keys of the same iteration), every later token reads
    the past tokens' last-iteration keys in every iteration. That is another function
    than forward (per_loop's), so the decoded rows differ from forward, and equal the
    explicit reference for the same chunking."""
    model, ids = _model(_elr()), _ids()
    full = _full_logits(model, ids, loops)
    for prompt, step in ((7, 1), (4, 4)):
        out, _ = _decoded(model, ids, prompt, step, loops=loops, kv_policy="last_loop")
        torch.testing.assert_close(out, _last_loop_reference(model, ids, prompt, step, loops), **EXACT)
        torch.testing.assert_close(out[:, :prompt], full[:, :prompt], **EXACT)
        assert (out[:, prompt:] - full[:, prompt:]).abs().max() > 1e-4


def test_last_loop_under_a_window_schedule_keeps_the_widest_window():
    """Coarse-to-fine full -> 6 -> 3: the last iteration writes with window 3, the first
    reads the whole past, so the one shared cache must keep every key (``keep``)."""
    model, ids = _model(_hybrid(**LOOPS["schedule"])), _ids()
    out, cache = _decoded(model, ids, 7, 1, kv_policy="last_loop")
    torch.testing.assert_close(out, _last_loop_reference(model, ids, 7, 1), **EXACT)
    assert (out[:, 7:] - _full_logits(model, ids)[:, 7:]).abs().max() > 1e-4
    (attn,) = [d for (layer, _, _), d in cache.layers.items() if model.arch.layers[layer].mixer.kind == "attn"]
    assert attn["keep"] is None and attn["kv.k"].shape[1] == ids.shape[1]


def test_last_loop_with_one_loop_is_per_loop():
    model, ids = _model(_elr()), _ids()
    last, _ = _decoded(model, ids, 5, loops=1, kv_policy="last_loop")
    per, _ = _decoded(model, ids, 5, loops=1, kv_policy="per_loop")
    assert torch.equal(last, per)
    torch.testing.assert_close(last, _full_logits(model, ids, 1), **EXACT)


def test_last_loop_keeps_one_kv_cache_per_attention_layer():
    """KV stays at the one-loop size at every loop count; recurrent state grows with k."""
    model, ids = _model(_elr()), _ids()
    size = {k: model.prefill(ids, loops=k, kv_policy="last_loop")[1].nbytes() for k in (1, 2, 4)}
    per = {k: model.prefill(ids, loops=k, kv_policy="per_loop")[1].nbytes() for k in (1, 2, 4)}
    assert size[1]["kv"] == size[2]["kv"] == size[4]["kv"] == per[1]["kv"] > 0
    assert per[4]["kv"] == 4 * per[1]["kv"]  # the one attention layer sits in the loop
    assert [size[k]["state"] for k in (1, 2, 4)] == [per[k]["state"] for k in (1, 2, 4)]
    assert size[1]["state"] < size[2]["state"] < size[4]["state"]


def test_last_loop_parallel_branch_shares_attention_and_keeps_recurrent_state_per_loop():
    """A parallel [window attn, gdn] mixer in a loop: its attention branch commits only in
    the last iteration, its GDN branch in every one; checked against per_loop at T = 1
    and against the attention-only split of the bytes."""
    arch = _arch(2, mixer=MIXERS["parallel"], loop={"boundary": "mixer", "T": 3}, kv_policy="last_loop")
    model, ids = _model(arch), _ids()
    out, cache = _decoded(model, ids, 6, kv_policy="last_loop")
    per, per_cache = _decoded(model, ids, 6, kv_policy="per_loop")
    torch.testing.assert_close(per, _full_logits(model, ids), **EXACT)
    assert (out - per).abs().max() > 1e-6
    assert 3 * cache.nbytes()["kv"] == per_cache.nbytes()["kv"]
    assert cache.nbytes()["state"] == per_cache.nbytes()["state"]


def test_commit_false_is_a_peek():
    """An ELR last_loop decode step writes KV only in the last iteration: peeking at the
    next token with ``commit=False`` on every leaf leaves every tensor unchanged."""
    model = _model(_arch(mixer=GDN))
    _, cache = model.prefill(_ids()[:, :8])
    before = {key: {n: v.clone() if torch.is_tensor(v) else v for n, v in d.items()} for key, d in cache.layers.items()}
    layer = model.layers[0]
    d, _ = cache.mixer_cache(0, (), True)
    layer.mixer(layer.mixer_norm(model.embed(_ids()[:, 8:9])), cache=d, commit=False)
    for key, d in cache.layers.items():
        assert d.keys() == before[key].keys()
        assert all(torch.equal(v, before[key][n]) if torch.is_tensor(v) else v == before[key][n] for n, v in d.items())


# ---------------------------------------------------------------- generate


def test_greedy_generate_is_the_argmax_rollout():
    model = _model(load_arch(ARCHS / "tiny_mixerloop.yaml"))
    prompt = torch.randint(0, model.arch.model.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, max_new_tokens=6)
    ids = prompt
    for _ in range(6):
        ids = torch.cat([ids, _full_logits(model, ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_sampling_follows_the_generator_and_top_k():
    model = _model(_arch(mixer=GDN))
    prompt = _ids(T=4)
    draw = lambda seed, **kw: model.generate(prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kw)
    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    assert torch.equal(draw(5, top_k=1), model.generate(prompt, 8))  # top-1 sampling is greedy
    assert model.generate(prompt, 0).equal(prompt)


def test_fla_backend_layers_say_how_to_decode():
    model = build_model(_arch(mixer=GDN), backend="fla")
    with pytest.raises(NotImplementedError, match="backend='torch'"):
        model.prefill(_ids()[:, :4])


def test_bf16_decode_keeps_the_recurrent_state_in_float32():
    model = _model(_arch(mixer=GDN), dtype=torch.bfloat16)
    ids = _ids()
    out, cache = _decoded(model, ids, 7)
    torch.testing.assert_close(out.float(), _full_logits(model, ids).float(), atol=5e-2, rtol=0)
    (d,) = [d for key, d in cache.layers.items() if key[0] == 0]
    assert d["state.recurrent"].dtype == torch.float32 and d["state.conv_q"].dtype == torch.bfloat16
