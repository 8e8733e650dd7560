"""nas.budget: solve one size so a spec hits a parameter or projection-compute target."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nas import SpecError, load_arch, load_spec, loads_arch, loads_spec, resolve
from nas.budget import match_budget, scale_arch, scale_to_params
from nas.cost import projection_flops, unique_params
from nas.spec import MatchSpec, MoESpec, SwiGLUSpec
from spaces import arch_path

TINY = """
name: tiny_match
model:
  vocab_size: 256
  width: 64
  defaults:
    attn: {num_heads: 4}
    gdn: {num_heads: 2, head_dim: 32, expand_v: 1}
    swiglu: {hidden_size: 128}
num_layers: 4
hybrid: {ratio: {attn: 1, gdn: 3}, placement: interleave}
loop: {boundary: mixer, T: 3, update: {kind: residual_gate}}
"""


def source(name):
    return load_spec(arch_path(name))


def measure(arch, field):
    return unique_params(arch) if field == "unique_params" else projection_flops(arch).total


@pytest.mark.parametrize("vary", ["ffn_hidden", "width", "num_layers"])
@pytest.mark.parametrize("field, target", [("unique_params", 25e6), ("projection_flops", 60e6)])
def test_match_hits_target(vary, field, target):
    match = MatchSpec(**{field: target}, vary=vary, tolerance=0.02)
    arch = match_budget(source("mixerloop_15m"), match)
    assert arch.is_canonical
    # within tolerance is the solver's own check; that no valid neighbouring size comes
    # closer is not
    x = size(arch, vary)
    miss = abs(measure(arch, field) - target)
    for step in (-1, 1):
        other = next((a for d in range(1, 65) if (a := at(arch, vary, x + step * d)) is not None), None)
        assert other is not None and abs(measure(other, field) - target) >= miss, (vary, x, step)


def size(arch, vary) -> int:
    return {"ffn_hidden": arch.layers[0].ffn.hidden_size, "width": arch.model.width,
            "num_layers": arch.L}[vary]


def at(matched, vary, x):
    """The matched spec with its free size set to ``x`` (None when that is invalid)."""
    if vary == "ffn_hidden":
        return matched.model_copy(update={"layers": tuple(
            l.model_copy(update={"ffn": l.ffn.model_copy(update={"hidden_size": x})}) for l in matched.layers)})
    src = source("mixerloop_15m")
    hidden = {"swiglu": {"hidden_size": matched.layers[0].ffn.hidden_size}}
    model = src.model.model_copy(update={"defaults": {**src.model.defaults, **hidden}})
    src = src.model_copy(update={"model": model})
    if vary == "width":
        src = src.model_copy(update={"model": src.model.model_copy(update={"width": x})})
    else:
        src = src.model_copy(update={"num_layers": x})
    try:
        return resolve(src)
    except SpecError:
        return None


def test_ffn_hidden_is_the_closest_size():
    """Neighbouring hidden sizes are no closer to the target."""
    target = 20e6
    arch = match_budget(source("noloop_15m"), MatchSpec(unique_params=target, vary="ffn_hidden"))
    h = arch.layers[0].ffn.hidden_size
    assert all(l.ffn.hidden_size == h for l in arch.layers)
    per_unit = 3 * arch.model.width * arch.L  # params per unit of hidden size
    assert abs(unique_params(arch) - target) <= per_unit / 2


@settings(max_examples=20, deadline=None)
@given(target=st.floats(2e5, 2e6))
def test_width_respects_divisibility(target):
    """Attention heads must divide the width: only such widths are considered, and steps
    of 4 around width 64-440 stay within 6% of any target."""
    arch = loads_arch(TINY + f"match: {{unique_params: {target}, vary: width, tolerance: 0.06}}\n")
    assert arch.model.width % 4 == 0
    assert abs(unique_params(arch) - target) / target <= 0.06


def test_yaml_match_block_lowers():
    arch = loads_arch(TINY + "match: {unique_params: 400000, vary: num_layers, tolerance: 0.1}\n")
    assert abs(unique_params(arch) - 4e5) / 4e5 <= 0.1
    assert arch.match is None and len(arch.loops) == arch.L


def test_moe_expert_hidden_is_resized():
    arch = match_budget(source("tiny_moe_replay"), MatchSpec(unique_params=5e5, vary="ffn_hidden"))
    hidden = {l.ffn.expert_hidden for l in arch.layers}
    assert len(hidden) == 1 and hidden != {64}
    assert abs(unique_params(arch) - 5e5) / 5e5 <= 0.01


def test_unreachable_targets_name_the_field():
    with pytest.raises(SpecError) as exc:
        match_budget(source("noloop_15m"), MatchSpec(unique_params=1e6, vary="ffn_hidden"))
    assert exc.value.problems[0].path == "match.unique_params"
    assert "smallest" in str(exc.value)
    with pytest.raises(SpecError) as exc:
        match_budget(source("noloop_15m"), MatchSpec(projection_flops=1e30, vary="num_layers"))
    assert exc.value.problems[0].path == "match.projection_flops"
    assert "largest" in str(exc.value)


def test_tolerance_miss_names_tolerance():
    """Layers come in steps of ~1.1M params at 15M; 0.1% cannot be met between them."""
    with pytest.raises(SpecError) as exc:
        match_budget(source("noloop_15m"), MatchSpec(unique_params=18.2e6, vary="num_layers",
                                                     tolerance=0.001))
    assert exc.value.problems[0].path == "match.tolerance"


def test_vary_needs_something_to_vary():
    explicit = loads_arch(TINY)  # canonical: an explicit layers list
    with pytest.raises(SpecError) as exc:
        match_budget(explicit, MatchSpec(unique_params=1e6, vary="num_layers"))
    assert exc.value.problems[0].path == "match.vary"
    no_ffn = loads_spec(TINY.replace("hybrid:", "layer: {mixer: {kind: gdn}, ffn: {kind: none}}\nhybrid:"))
    with pytest.raises(SpecError) as exc:
        match_budget(no_ffn, MatchSpec(unique_params=1e6, vary="ffn_hidden"))
    assert exc.value.problems[0].path == "match.vary"


# ---------------------------------------------------------------- proportional scaling

ATTN = """
name: tiny_attn
model:
  vocab_size: 256
  width: 64
  defaults: {attn: {num_heads: 4, num_kv_heads: 2}, swiglu: {hidden_size: 160}}
num_layers: 2
layer: {mixer: {kind: attn}, ffn: {kind: swiglu}}
"""
MIXERS = """
name: tiny_other_mixers
model: {vocab_size: 256, width: 64}
layers:
  - {mixer: {kind: deltanet, num_heads: 2}, ffn: {kind: swiglu, hidden_size: 96}}
  - {mixer: {kind: mamba2, head_dim: 16, state_size: 16}, ffn: {kind: none}}
  - {mixer: {kind: kda, num_heads: 2, head_dim: 16, num_v_heads: 4}}
"""
SCALED = {  # GDN, attention (GQA), a hybrid, MixerLoop, ELR with MoE, other mixers
    "gdn": lambda: load_spec(arch_path("tiny_noloop")), "attn": lambda: loads_spec(ATTN),
    "hybrid": lambda: load_spec(arch_path("tiny_lt2_interleave")),
    "mixerloop": lambda: load_spec(arch_path("tiny_mixerloop")),
    "elr": lambda: load_spec(arch_path("tiny_elr")), "elr_moe": lambda: load_spec(arch_path("tiny_moe_replay")),
    "mixers": lambda: loads_spec(MIXERS),
}


def heads(mixer) -> dict:
    return {f: getattr(mixer, f) for f in ("num_heads", "num_kv_heads", "num_v_heads") if getattr(mixer, f, None)}


def head_dim(mixer, width):
    if mixer.kind == "deltanet":
        return width * mixer.expand_k / mixer.num_heads
    return mixer.head_dim


def ffn_sizes(ffn) -> dict:
    if isinstance(ffn, SwiGLUSpec):
        return {"hidden_size": ffn.hidden_size}
    if isinstance(ffn, MoESpec):
        return {"expert_hidden": ffn.expert_hidden, "shared_expert_hidden": ffn.shared_expert_hidden}
    return {}


@pytest.mark.parametrize("name", SCALED)
def test_scale_arch_doubles_every_size_and_keeps_the_rest(name):
    small = resolve(SCALED[name]())
    big = scale_arch(SCALED[name](), 2)
    assert big.is_canonical and big.model.width == 2 * small.model.width
    assert big.loops == small.loops and big.elastic == small.elastic and big.kv_policy == small.kv_policy
    for a, b in zip(small.layers, big.layers, strict=True):
        assert (b.mixer.kind, b.ffn.kind, b.norm_placement) == (a.mixer.kind, a.ffn.kind, a.norm_placement)
        assert heads(b.mixer) == {k: 2 * v for k, v in heads(a.mixer).items()}
        assert head_dim(b.mixer, big.model.width) == head_dim(a.mixer, small.model.width)
        assert ffn_sizes(b.ffn) == {k: 2 * v for k, v in ffn_sizes(a.ffn).items()}
        rest = lambda m: m.model_dump(exclude={"num_heads", "num_kv_heads", "num_v_heads"})
        assert rest(b.mixer) == rest(a.mixer)
    assert scale_arch(big, 0.5) == small  # and back


def test_scale_one_is_the_canonical_form():
    src = load_spec(arch_path("tiny_elr"))
    assert scale_arch(src, 1) == load_arch(arch_path("tiny_elr"))
    assert scale_arch(load_arch(arch_path("tiny_elr")), 1.0) == load_arch(arch_path("tiny_elr"))


def test_scale_arch_rounds_to_the_nearest_valid_width():
    """Mamba-2's heads are expand * width / head_dim: only widths that keep that an integer
    are valid, and 1.3 × 64 = 83.2 is not one; the nearest is 80."""
    arch = scale_arch(loads_spec(MIXERS), 1.3)
    assert arch.model.width == 80 and arch.layers[1].mixer.num_heads == 10


@pytest.mark.parametrize("factor", [0, -2, float("inf"), float("nan"), True, "2"])
def test_scale_arch_refuses_what_is_not_a_factor(factor):
    with pytest.raises(SpecError) as exc:
        scale_arch(load_spec(arch_path("tiny_noloop")), factor)
    assert exc.value.problems[0].path == "factor"


def test_scale_arch_names_a_factor_with_no_valid_spec():
    """One Mamba-2 head of 256 at width 256: only multiples of 256 are valid widths, and
    none lies within 64 of 1.5 × 256 = 384."""
    src = loads_spec("model: {vocab_size: 256, width: 256}\nlayers: [{mixer: {kind: mamba2, "
                     "head_dim: 256, expand: 1, state_size: 16}}]\n")
    assert scale_arch(src, 2).layers[0].mixer.num_heads == 2
    with pytest.raises(SpecError) as exc:
        scale_arch(src, 1.5)
    assert exc.value.problems[0].path == "factor" and "384" in str(exc.value)


@pytest.mark.parametrize("name, target", [("tiny_noloop", 2e6), ("tiny_elr", 5e6), ("tiny_moe_replay", 1e7),
                                          ("tiny_coarse_to_fine", 3e5)])
def test_scale_to_params_lands_within_two_percent(name, target):
    small = load_arch(arch_path(name))
    big = scale_to_params(load_spec(arch_path(name)), target)
    assert abs(unique_params(big) - target) / target <= 0.02
    assert big.loops == small.loops and [l.mixer.kind for l in big.layers] == [l.mixer.kind for l in small.layers]
    grows = big.model.width > small.model.width
    assert grows == (target > unique_params(small))
    assert all((b.mixer.num_heads > a.mixer.num_heads) == grows for a, b in zip(small.layers, big.layers))


def test_scale_to_params_refuses_a_bad_target():
    for bad in (0, -1e6, float("inf"), float("nan")):
        with pytest.raises(SpecError) as exc:
            scale_to_params(load_spec(arch_path("tiny_noloop")), bad)
        assert exc.value.problems[0].path == "unique_params"


def test_export_scale_to_is_the_same_rule():
    from runners.export.scale import proportional

    arch = load_arch(arch_path("tiny_lt2_interleave"))
    assert proportional(arch, 5e6, 0.02) == scale_to_params(arch, 5e6)


@pytest.mark.parametrize("field, target", [("unique_params", 3e6), ("projection_flops", 2e7)])
def test_match_vary_scale_reaches_the_target(field, target):
    """``vary: scale`` in a spec's match: grown in proportion, then landed by the FFN width."""
    arch = loads_arch(TINY + f"match: {{{field}: {target}, vary: scale}}\n")
    small = loads_arch(TINY)
    assert abs(measure(arch, field) - target) / target <= 0.01
    assert arch.model.width > small.model.width and arch.loops == small.loops
    assert [l.mixer.head_dim for l in arch.layers] == [l.mixer.head_dim for l in small.layers]
    assert all(b.mixer.num_heads > a.mixer.num_heads for a, b in zip(small.layers, arch.layers))
