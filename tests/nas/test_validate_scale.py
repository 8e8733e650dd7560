"""Validation works on the plan (layers and regions), never on the unrolled applications:
its cost does not grow with T, total depth is capped with a one-line error, and the
overlap check is a sort, not a pairwise scan."""
import importlib
import itertools
import random

import pytest

from builders.model import build_model
from nas.cost import cost
from nas.errors import SpecError
from nas.load import loads_arch, resolve, spec_from_dict
from nas.plan import flat_counts, plan, total_applications, unroll
from nas.spec import MAX_APPLICATIONS
from nas.validate import overlap_problems

GDN = {"kind": "gdn", "num_heads": 2, "head_dim": 32, "expand_v": 1}


def source(L: int, regions: list[tuple[int, int, int]]) -> dict:
    """Regions as (first flat, last flat, T)."""
    addr = lambda f: {"layer": f // 2, "op": ("mixer", "ffn")[f % 2]}
    return {"model": {"vocab_size": 256, "width": 64}, "num_layers": L,
            "layer": {"mixer": GDN, "ffn": {"kind": "swiglu", "hidden_size": 128}},
            "loops": [{"start": addr(a), "end": addr(b), "T": t} for a, b, t in regions]}


@pytest.fixture
def no_unrolling(monkeypatch):
    """Walking the unrolled applications or graph fails the test."""
    def boom(*args, **kwargs):
        raise AssertionError("unrolled the plan")
    monkeypatch.setattr(importlib.import_module("nas.graph"), "unrolled_graph", boom)
    monkeypatch.setattr(importlib.import_module("nas.plan"), "unroll", boom)


def test_validate_cost_and_build_never_unroll(no_unrolling):
    """Nested block T=256 × mixer T=256: 11.6 s and 570 MB when validation unrolled it."""
    src = spec_from_dict(source(4, [(0, 7, 256)] + [(2 * i, 2 * i, 256) for i in range(4)]))
    arch = resolve(src)
    assert total_applications(arch) == 256 * (4 * 256 + 4)
    assert cost(arch).figures.ops[0].applications == 256 * 256
    model = build_model(src, device="meta")
    assert model.unrolled_depth() == total_applications(arch)


def test_application_cap_is_one_line():
    src = spec_from_dict(source(4, [(0, 7, 1024)] + [(2 * i, 2 * i, 1024) for i in range(4)]))
    with pytest.raises(SpecError) as exc:
        resolve(src)
    (problem,) = exc.value.problems
    assert problem.path == "loops" and "\n" not in problem.message
    assert f"over the cap of {MAX_APPLICATIONS:,}" in problem.message
    assert "4,198,400 sublayer applications" in problem.message


def test_application_cap_counts_elastic_loop_counts():
    text = """
model: {vocab_size: 256, width: 64}
num_layers: 513
layer: {mixer: {kind: gdn, num_heads: 2, head_dim: 32, expand_v: 1}}
loop: {boundary: block, T: 2}
elastic: {train: {values: [1, 1024], weights: [1, 1]}, eval: [1]}
"""
    with pytest.raises(SpecError, match="at 1024 loops runs 1,050,624 sublayer"):
        loads_arch(text)


def test_cap_allows_the_largest_spec_within_it():
    arch = resolve(spec_from_dict(source(2048, [(0, 4095, 256)])))
    assert total_applications(arch) == MAX_APPLICATIONS


def _pairwise_overlaps(spans) -> set[int]:
    """The reference: every pair that is neither disjoint nor strictly nested."""
    bad = set()
    for (i, (a0, a1)), (j, (b0, b1)) in itertools.combinations(enumerate(spans), 2):
        disjoint = a1 < b0 or b1 < a0
        nested = (a0 <= b0 and b1 <= a1 or b0 <= a0 and a1 <= b1) and (a0, a1) != (b0, b1)
        if not (disjoint or nested):
            bad.add(j)
    return bad


@pytest.mark.parametrize("seed", range(40))
def test_overlap_check_matches_the_pairwise_reference(seed):
    rng = random.Random(seed)
    spans = []
    for _ in range(rng.randint(1, 7)):
        a = rng.randrange(12)
        spans.append((a, rng.randrange(a, 12)))
    regions = spec_from_dict(source(6, [(a, b, 2) for a, b in spans])).loops
    arch = resolve(spec_from_dict(source(6, []))).model_copy(update={"loops": regions})
    found = {int(p.path[len("loops["):-1]) for p in overlap_problems(arch)}
    reference = _pairwise_overlaps(spans)
    assert bool(found) == bool(reference)
    assert found <= set(range(len(spans)))


def test_overlap_check_is_not_quadratic(no_unrolling):
    """2048 nested spans and 2048 disjoint ones: one sort (a pairwise scan is 8M pairs)."""
    spans = [(i, 4095 - i, 1) for i in range(2048)] + [(2 * i, 2 * i, 1) for i in range(2048, 4096)]
    arch = resolve(spec_from_dict(source(4096, spans)))
    assert overlap_problems(arch) == []
    bad = arch.model_copy(update={"loops": arch.loops + spec_from_dict(source(4096, [(1, 4096, 1)])).loops})
    assert [p.path for p in overlap_problems(bad)] == ["loops[4096]"]


@pytest.mark.parametrize("seed", range(20))
def test_plan_matches_region_products(seed):
    """The one-pass plan nests regions by containment: each sublayer runs the product of
    the T's around it, in execution order."""
    rng = random.Random(seed)
    spans: list[tuple[int, int, int]] = []
    for _ in range(rng.randint(0, 5)):
        a = rng.randrange(10)
        b = rng.randrange(a, 10)
        cand = spans + [(a, b, rng.randint(1, 3))]
        if not _pairwise_overlaps([(x, y) for x, y, _ in cand]):
            spans = cand
    arch = resolve(spec_from_dict(source(5, spans)))
    apps = [addr.flat for addr, _ in unroll(plan(arch))]
    assert [apps.count(f) for f in range(10)] == flat_counts(arch)
    firsts = sorted(range(10), key=apps.index)
    assert firsts == list(range(10))
