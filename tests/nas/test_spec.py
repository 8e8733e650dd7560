"""The DSL: YAML round-trips, lowering (placement, defaults, loop sugar) and execution plans."""
import importlib
from collections import Counter

import pytest

from nas import (
    ArchSpec, AttnSpec, GDNSpec, LayerSpec, LoopRegion, LoopSugar, ModelSpec, MoESpec, OpAddr,
    SpecError, SwiGLUSpec, SwitchSpec, applications, dump_yaml, load_arch, load_spec, loads_arch,
    loads_spec, lower, unroll,
)
from nas.plan import plan
from nas.spec import DSASpec, ElasticSpec, HybridSpec, Mamba2Spec, ParallelSpec, ResidualGateUpdate
from spaces import ARCHS

lowering = importlib.import_module("nas.lower")  # the module, not nas.lower the function
SHIPPED = sorted(ARCHS.glob("*.yaml"))
IDS = [p.stem for p in SHIPPED]
TINY = "model: {vocab_size: 256, width: 64}\n"
GDN = "{kind: gdn, num_heads: 2, head_dim: 32, expand_v: 1}"


def addr(layer: int, op: str) -> OpAddr:
    return OpAddr(layer=layer, op=op)


def span(region: LoopRegion) -> tuple[str, str, int]:
    return str(region.start), str(region.end), region.T


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_source_round_trip(path):
    spec = load_spec(path)
    text = dump_yaml(spec)
    again = loads_spec(text)
    assert again == spec
    assert dump_yaml(again) == text  # the set fields survive too, so defaults keep applying
    assert not spec.is_canonical


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_canonical_round_trip(path):
    arch = load_arch(path)
    assert arch.is_canonical
    again = loads_spec(dump_yaml(arch))
    assert again == arch
    assert loads_arch(dump_yaml(arch)) == arch
    assert lower(load_spec(path)) == arch


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_lowering_is_idempotent(path):
    once = lower(load_spec(path))
    assert lower(once) == once
    assert lower(lower(once)) == once


def test_python_built_specs_round_trip():
    source = ArchSpec(
        name="py", model=ModelSpec(vocab_size=256, width=64, defaults={"gdn": {"num_heads": 2}}),
        num_layers=3, layer=LayerSpec(mixer=GDNSpec(head_dim=32), ffn=MoESpec(num_experts=4)),
        loop=LoopSugar(boundary="mixer", T=2, update=ResidualGateUpdate(shared=False)),
        elastic=ElasticSpec(eval=(1, 2)),
    )
    back = loads_spec(dump_yaml(source))
    assert back == source and dump_yaml(back) == dump_yaml(source)
    arch = lower(source)
    assert arch.layers[0].mixer.num_heads == 2 and arch.layers[0].mixer.head_dim == 32
    assert loads_spec(dump_yaml(arch)) == arch and loads_arch(dump_yaml(arch)) == arch

    canonical = ArchSpec(
        model=ModelSpec(vocab_size=256, width=64),
        layers=(LayerSpec(mixer=AttnSpec(num_heads=4, head_dim=16, window=32)),
                LayerSpec(mixer=ParallelSpec(branches=(GDNSpec(num_heads=2, head_dim=32),
                                                       Mamba2Spec(num_heads=2, head_dim=64))),
                          ffn=SwiGLUSpec(hidden_size=128))),
        loops=(LoopRegion(start=addr(0, "mixer"), end=addr(1, "ffn"), T=3),),
    )
    assert loads_spec(dump_yaml(canonical)) == canonical
    assert lower(canonical).layers[0].ffn == SwiGLUSpec(hidden_size=256)  # fla's default


def test_source_dump_omits_unset_fields():
    spec = loads_spec(TINY + "num_layers: 2\nlayer: {mixer: {kind: gdn, num_heads: 6}}\n")
    text = dump_yaml(spec)
    assert "num_heads: 6" in text  # explicit, even though 6 is the class default
    assert "head_dim" not in text and "ffn" not in text


# ---------------------------------------------------------------- hybrid placement


@pytest.mark.parametrize("rule, attn", [
    ("interleave", [4, 9, 14, 19]),
    ("bookend", [0, 1, 18, 19]),
    ("front", [0, 1, 2, 3]),
    ("back", [16, 17, 18, 19]),
])
def test_placement_rules(rule, attn):
    names = lowering.placement(HybridSpec(ratio={"attn": 1, "gdn": 4}, placement=rule), 20)
    assert [i for i, n in enumerate(names) if n == "attn"] == attn
    assert Counter(names) == {"attn": 4, "gdn": 16}


def test_placement_explicit_list_and_three_names():
    explicit = ("gdn", "attn", "gdn", "swa")
    assert lowering.placement(HybridSpec(ratio={"attn": 1}, placement=explicit), 4) == list(explicit)
    names = lowering.placement(HybridSpec(ratio={"attn": 1, "swa": 1, "gdn": 4}), 12)
    assert Counter(names) == {"gdn": 8, "swa": 2, "attn": 2}
    assert names[-1] == "attn" and names[:4] == ["gdn"] * 4


@pytest.mark.parametrize("L", [1, 5, 7, 20, 33])
def test_ratio_counts_sum_to_L(L):
    counts = lowering.ratio_counts({"attn": 1, "swa": 2, "gdn": 4}, L)
    assert sum(counts.values()) == L
    assert counts["gdn"] >= counts["swa"] >= counts["attn"]


HYBRID_MODEL = ("model:\n  vocab_size: 256\n  width: 64\n"
                "  defaults: {gdn: {num_heads: 2, head_dim: 32}, attn: {num_heads: 4}}\n")


def test_hybrid_lowering_uses_named_mixers_and_layer_ffn():
    arch = loads_arch(HYBRID_MODEL + "num_layers: 5\n"
                      "layer: {mixer: {kind: gdn}, ffn: {kind: swiglu, hidden_size: 96}}\n"
                      "hybrid:\n  ratio: {swa: 1, gdn: 4}\n"
                      "  mixers: {swa: {kind: attn, window: 16}}\n")
    assert [l.mixer.kind for l in arch.layers] == ["gdn"] * 4 + ["attn"]
    assert arch.layers[4].mixer == AttnSpec(num_heads=4, head_dim=16, window=16)
    assert {l.ffn for l in arch.layers} == {SwiGLUSpec(hidden_size=96)}


RANDOM = HYBRID_MODEL + "num_layers: 3\nhybrid: {ratio: {attn: 1, gdn: 2}, placement: random}\n"


def test_random_placement_makes_switch_layers():
    arch = loads_arch(RANDOM)
    assert all(isinstance(l.mixer, SwitchSpec) for l in arch.layers)
    assert [o.kind for o in arch.layers[0].mixer.options] == ["attn", "gdn"]
    assert arch.layers[0].mixer.options[0].head_dim == 16
    assert arch.random_placement is not None and arch.random_placement.placement == "random"


def test_switch_layers_need_random_placement():
    stripped = loads_arch(RANDOM).model_copy(update={"random_placement": None})
    with pytest.raises(SpecError, match=r"layers\[0\]\.mixer: a switch mixer needs random_placement"):
        loads_arch(dump_yaml(stripped))


# ---------------------------------------------------------------- model.defaults


def test_defaults_fill_unset_fields_and_explicit_fields_win():
    arch = loads_arch(
        "model:\n  vocab_size: 256\n  width: 64\n  defaults:\n"
        "    gdn: {num_heads: 4, head_dim: 16, expand_v: 1}\n    swiglu: {hidden_size: 128}\n"
        "layers:\n"
        "  - {mixer: {kind: gdn}}\n"
        "  - {mixer: {kind: gdn, num_heads: 6, head_dim: 256, expand_v: 2}, ffn: {kind: swiglu, hidden_size: 96}}\n"
        "  - {mixer: {kind: parallel, branches: [{kind: gdn, num_heads: 2}, {kind: attn, num_heads: 4}]}}\n")
    first, second, third = arch.layers
    assert (first.mixer.num_heads, first.mixer.head_dim, first.mixer.expand_v) == (4, 16, 1.0)
    assert first.ffn.hidden_size == 128
    # explicit values win, even when they equal the class defaults (6, 256, 2.0)
    assert (second.mixer.num_heads, second.mixer.head_dim, second.mixer.expand_v) == (6, 256, 2.0)
    assert second.ffn.hidden_size == 96
    gdn, attn = third.mixer.branches
    assert (gdn.num_heads, gdn.head_dim) == (2, 16) and attn.head_dim == 16
    assert not arch.model.defaults


def test_defaults_for_composite_mixers_apply():
    arch = loads_arch("model: {vocab_size: 256, width: 64, defaults: {parallel: {combine: concat}}}\n"
                      "num_layers: 1\nlayer: {mixer: {kind: parallel, branches: [" + GDN +
                      ", {kind: attn, num_heads: 2}]}}\n")
    assert arch.layers[0].mixer.combine == "concat"


def test_defaults_conflict_is_reported_at_the_layer():
    with pytest.raises(SpecError) as info:
        loads_arch("model: {vocab_size: 256, width: 64, defaults: {moe: {top_k: 3}}}\n"
                   "layers:\n  - {mixer: " + GDN + "}\n  - {mixer: " + GDN +
                   ", ffn: {kind: moe, num_experts: 2}}\n")
    assert [p.path for p in info.value.problems] == ["layers[1].ffn.top_k"]


def test_derived_sizes():
    arch = loads_arch(TINY + "layers:\n  - {mixer: {kind: attn, num_heads: 4}}\n"
                      "  - {mixer: {kind: dsa, num_heads: 8}}\n  - {mixer: {kind: mamba2, head_dim: 32}, "
                      "ffn: {kind: moe, num_experts: 2, top_k: 1}}\n")
    assert arch.layers[0].mixer.head_dim == 16
    assert arch.layers[1].mixer == DSASpec(num_heads=8, head_dim=8)
    assert arch.layers[2].mixer.num_heads == 4  # expand 2 * width 64 / head_dim 32
    assert arch.layers[2].ffn.expert_hidden == lowering.default_ffn_hidden(64) == 256


# ---------------------------------------------------------------- loop sugar


def _loop(spec_loop: str, layers: str = "num_layers: 4\nlayer: {mixer: " + GDN + "}\n") -> ArchSpec:
    return loads_arch(TINY + layers + spec_loop)


def test_block_mixer_ffn_boundaries():
    assert [span(r) for r in _loop("loop: {boundary: block, T: 3}\n").loops] == [
        ("layers[0].mixer", "layers[3].ffn", 3)]
    assert [span(r) for r in _loop("loop: {boundary: mixer, T: 2}\n").loops] == [
        (f"layers[{i}].mixer", f"layers[{i}].mixer", 2) for i in range(4)]
    assert [span(r) for r in _loop("loop: {boundary: ffn, T: 2}\n").loops] == [
        (f"layers[{i}].ffn", f"layers[{i}].ffn", 2) for i in range(4)]
    assert _loop("loop: {boundary: none}\n").loops == ()


def test_selective_loops():
    arch = load_arch(ARCHS / "tiny_selective.yaml")
    assert [l.mixer.kind for l in arch.layers] == ["gdn", "gdn", "gdn", "attn"]
    assert [span(r) for r in arch.loops] == [(f"layers[{i}].mixer",) * 2 + (3,) for i in range(3)]
    assert all(not r.update.shared for r in arch.loops)
    spanned = _loop("loop: {boundary: selective, unit: span, T: 2, "
                    "select: {ops: [mixer, ffn], layers: [1, 2]}}\n")
    assert [span(r) for r in spanned.loops] == [("layers[1].mixer", "layers[2].ffn", 2)]
    ffns = _loop("loop: {boundary: selective, T: 2, select: {ops: [ffn], kinds: [swiglu], "
                 "layers: [2, 3]}}\n")
    assert [span(r) for r in ffns.loops] == [("layers[2].ffn",) * 2 + (2,), ("layers[3].ffn",) * 2 + (2,)]


def test_elr_lowering():
    arch = load_arch(ARCHS / "tiny_elr.yaml")
    (region,) = arch.loops
    assert span(region) == ("layers[1].mixer", "layers[2].ffn", 4)
    assert region.update.kind == "gated_step" and region.conditioning == "index_budget"
    arch = load_arch(ARCHS / "elr_hybrid.yaml")
    assert span(arch.loops[0]) == ("layers[2].mixer", "layers[5].ffn", 4)
    assert arch.kv_policy == "last_loop" and arch.elastic.switch_at == 0.75


def test_window_schedule_lowering():
    arch = load_arch(ARCHS / "tiny_coarse_to_fine.yaml")
    sched = [(o.iteration, o.layer, o.window) for o in arch.loops[0].schedule]
    assert sched == [(t, i, w) for t, w in enumerate(["full", 32, 16, 8]) for i in (0, 1)]
    mixed = _loop("loop: {boundary: mixer, T: 2, windows: [full, 8]}\n",
                  "layers:\n  - {mixer: " + GDN + "}\n  - {mixer: {kind: attn, num_heads: 4}}\n")
    assert [r.schedule for r in mixed.loops][0] == ()
    assert [(o.iteration, o.layer, o.window) for o in mixed.loops[1].schedule] == [(0, 1, "full"), (1, 1, 8)]


def test_several_loop_sugars_and_explicit_loops_combine():
    arch = _loop("loop:\n  - {boundary: selective, select: {layers: [0, 0]}, T: 2}\n"
                 "  - {boundary: selective, select: {ops: [ffn], layers: [3, 3]}, T: 3}\n"
                 "loops:\n  - {start: {layer: 1, op: mixer}, end: {layer: 2, op: ffn}, T: 4}\n")
    assert [span(r) for r in arch.loops] == [("layers[1].mixer", "layers[2].ffn", 4),
                                             ("layers[0].mixer", "layers[0].mixer", 2),
                                             ("layers[3].ffn", "layers[3].ffn", 3)]


# ---------------------------------------------------------------- execution plans


def _counts(arch: ArchSpec, loops: int | None = None) -> tuple[int, int]:
    runs = applications(arch, loops)
    return (sum(v for a, v in runs.items() if a.op == "mixer"),
            sum(v for a, v in runs.items() if a.op == "ffn"))


def test_unroll_counts_paper_configs():
    mixer = load_arch(ARCHS / "mixerloop_15m.yaml")
    assert _counts(mixer) == (6 * 4, 6)
    assert len(list(unroll(plan(mixer)))) == 6 * (4 + 1)
    full = load_arch(ARCHS / "fullloop_15m.yaml")
    assert _counts(full) == (4 * 6, 4 * 6)
    assert len(list(unroll(plan(full)))) == 4 * 6 * 2
    noloop = load_arch(ARCHS / "noloop_15m.yaml")
    assert len(list(unroll(plan(noloop)))) == 6 * 2
    order = [str(a) for a, _ in unroll(plan(mixer))][:6]
    assert order == ["layers[0].mixer"] * 4 + ["layers[0].ffn", "layers[1].mixer"]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_elr_applications_at_k_loops(k):
    arch = load_arch(ARCHS / "elr_hybrid.yaml")
    L_in, L_rec, L_out = 2, 4, 2
    assert len(list(unroll(plan(arch, loops=k)))) == 2 * (L_in + k * L_rec + L_out)
    runs = applications(arch, loops=k)
    assert [runs[addr(i, "mixer")] for i in range(8)] == [1, 1] + [k] * 4 + [1, 1]


def test_nested_loops_run_inner_inside_outer():
    arch = loads_arch(TINY + "layers:\n  - {mixer: " + GDN + "}\n  - {mixer: " + GDN + "}\n"
                      "loops:\n  - {start: {layer: 0, op: mixer}, end: {layer: 1, op: ffn}, T: 2}\n"
                      "  - {start: {layer: 0, op: mixer}, end: {layer: 0, op: mixer}, T: 3}\n")
    steps = [(str(a), p) for a, p in unroll(plan(arch))]

    def outer_iteration(t):
        inner = [("layers[0].mixer", ((0, t), (1, s))) for s in range(3)]
        return inner + [(x, ((0, t),)) for x in ("layers[0].ffn", "layers[1].mixer", "layers[1].ffn")]

    assert steps == outer_iteration(0) + outer_iteration(1)
    assert _counts(arch) == (2 * (3 + 1), 2 * 2)
