"""nas.budget: solve one size so a spec hits a parameter or projection-compute target."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nas import SpecError, load_spec, loads_arch, loads_spec, resolve
from nas.budget import match_budget
from nas.cost import projection_flops, unique_params
from nas.spec import MatchSpec
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
