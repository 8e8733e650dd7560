"""The canonical form is self-contained: a switch's options and its random-placement
weights agree, lowering never calls the budget matcher (resolve runs lower → validate →
match), and ``nas`` has no import cycle."""
import ast
import importlib
from pathlib import Path

import networkx as nx
import pytest

from nas import loads_arch, lower, resolve, unique_params, validate
from nas.errors import SpecError
from nas.load import loads_spec
from nas.spec import GDNSpec, HybridSpec, SwitchSpec

ROOT = Path(__file__).resolve().parents[1]
RANDOM = """
model: {vocab_size: 256, width: 64, defaults: {attn: {num_heads: 4}, gdn: {num_heads: 2, head_dim: 32,
        expand_v: 1}, swiglu: {hidden_size: 128}}}
num_layers: 4
hybrid: {ratio: {attn: 1, gdn: 1}, placement: random}
"""


def test_switch_options_and_ratio_must_agree():
    """3 options priced at 1/3 each while the executor never drew option 2: now invalid."""
    arch = loads_arch(RANDOM)
    third = GDNSpec(num_heads=2, head_dim=32, expand_v=2)
    layers = tuple(l.model_copy(update={"mixer": SwitchSpec(options=l.mixer.options + (third,))})
                   for l in arch.layers)
    bad = arch.model_copy(update={"layers": layers})
    problems = validate(bad)
    assert [p.path for p in problems] == [f"layers[{i}].mixer.options" for i in range(4)]
    assert "3 options but random_placement.ratio names 2" in problems[0].message
    fixed = bad.model_copy(update={"random_placement": HybridSpec(ratio={"attn": 1, "gdn": 1, "g2": 2},
                                                                   placement="random")})
    assert validate(fixed) == []


TINY = RANDOM.replace("hybrid: {ratio: {attn: 1, gdn: 1}, placement: random}",
                      "layer: {mixer: {kind: gdn}}")


def test_lower_never_calls_the_budget_matcher(monkeypatch):
    spec = loads_spec(TINY + "match: {unique_params: 400000, vary: num_layers, tolerance: 0.1}\n")
    budget = importlib.import_module("nas.budget")
    load = importlib.import_module("nas.load")
    calls = []
    real = budget.match_budget
    monkeypatch.setattr(load, "match_budget", lambda s, m: calls.append(m) or real(s, m))
    canonical = lower(spec)
    assert calls == [] and canonical.L == 4 and canonical.match is None
    matched = resolve(spec)
    assert len(calls) == 1 and matched.L != 4
    assert abs(unique_params(matched) - 400000) <= 0.1 * 400000


def test_match_runs_after_validation():
    """An invalid spec is reported as written, before any size is searched."""
    with pytest.raises(SpecError, match="num_heads"):
        loads_arch(TINY.replace("layer: {mixer: {kind: gdn}}", "layer: {mixer: {kind: gdn, num_v_heads: 3}}")
                   + "match: {unique_params: 4e5, vary: width}\n")


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``package`` imported anywhere in a file (function-level imports too)."""
    mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    base = mod.rsplit(".", 1)[0] if path.name != "__init__.py" else mod.removesuffix(".__init__")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith(package):
                out.add(target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(package)}
    return out


def test_nas_has_no_import_cycle():
    """lower ↔ budget ↔ cost was a cycle, papered over by a function-level import."""
    g = nx.DiGraph()
    for path in (ROOT / "nas").rglob("*.py"):
        if path.name == "__init__.py":
            continue
        mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for dep in _imports(path, "nas"):
            if dep != "nas" and not dep.endswith("__init__"):
                g.add_edge(mod, dep if (ROOT / (dep.replace(".", "/") + ".py")).exists() else dep)
    cycles = list(nx.simple_cycles(g))
    assert cycles == []


def test_topk_schedule_sugar_lowers_like_windows():
    arch = loads_arch("""
model: {vocab_size: 256, width: 64, defaults: {dsa: {num_heads: 4, topk: 16}, gdn: {num_heads: 2, head_dim: 32, expand_v: 1}}}
num_layers: 4
hybrid: {ratio: {dsa: 1, gdn: 1}, placement: interleave}
loop: {boundary: block, T: 3, topk: [16, 8, 4]}
""")
    dsa = [i for i, l in enumerate(arch.layers) if l.mixer.kind == "dsa"]
    (region,) = arch.loops
    assert sorted((o.iteration, o.layer, o.topk) for o in region.schedule) == sorted(
        (t, i, k) for t, k in enumerate((16, 8, 4)) for i in dsa)
    mixer = importlib.import_module("nas.graph").folded_graph(arch).nodes[f"layers.{dsa[0]}.mixer"]
    assert mixer["schedule"] == "top-k 16→8→4"
