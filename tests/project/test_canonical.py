"""The canonical form is self-contained: a switch states the probability of each option
(read by the cost model and the placement sampler alike) and random placement agrees, lowering never calls the budget matcher (resolve runs lower → validate →
match), and ``nas`` has no import cycle."""
import ast
import importlib
from pathlib import Path

import networkx as nx
import pytest
import torch

from nas import loads_arch, lower, resolve, unique_params, validate
from nas.cost import cost, op_active_params, projection_flops
from nas.errors import SpecError
from nas.load import dump_yaml, loads_spec
from nas.plan import applications
from nas.spec import GDNSpec, HybridSpec, OpAddr, SwitchSpec
from helpers import REPO

ROOT = REPO
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
    layers = tuple(l.model_copy(update={"mixer": SwitchSpec(options=l.mixer.options + (third,),
                                                            weights=(1 / 3,) * 3)})
                   for l in arch.layers)
    bad = arch.model_copy(update={"layers": layers})
    problems = validate(bad)
    assert [p.path for p in problems] == [f"layers[{i}].mixer.options" for i in range(4)]
    assert "3 options but random_placement.ratio names 2" in problems[0].message
    three = HybridSpec(ratio={"attn": 1, "gdn": 1, "g2": 2}, placement="random")
    fixed = bad.model_copy(update={"random_placement": three})
    # one name per option, but the thirds are not what a ratio-1:1:2 permutation draws
    problems = validate(fixed)
    assert [p.path for p in problems] == [f"layers[{i}].mixer.weights" for i in range(4)]
    assert "probabilities (0.25, 0.25, 0.5)" in problems[0].message
    right = tuple(l.model_copy(update={"mixer": l.mixer.model_copy(update={"weights": (0.25, 0.25, 0.5)})})
                  for l in layers)
    assert validate(fixed.model_copy(update={"layers": right})) == []
    # weights left out are filled by lowering, from the same placement
    blank = tuple(l.model_copy(update={"mixer": l.mixer.model_copy(update={"weights": None})}) for l in layers)
    unlowered = fixed.model_copy(update={"layers": blank})
    assert not unlowered.is_canonical
    problem = validate(unlowered)[0]
    assert problem.path == "layers[0].mixer.weights" and problem.message.startswith("missing")
    assert lower(unlowered).layers == right


def _switch_weights(text: str) -> set:
    return {l.mixer.weights for l in loads_arch(text).layers}


def test_lowering_writes_switch_weights_for_both_sampling_modes():
    """ratio sampling: count_i / L (a permutation at the ratio's counts); uniform: ratio_i / Σ.
    Over 6 layers, 1:3 gives counts 2 and 4, so the two modes differ."""
    six = RANDOM.replace("num_layers: 4", "num_layers: 6").replace("attn: 1, gdn: 1", "attn: 1, gdn: 3")
    assert _switch_weights(six) == {(2 / 6, 4 / 6)}
    uniform = six.replace("placement: random", "placement: random, sampling: uniform")
    assert _switch_weights(uniform) == {(0.25, 0.75)}
    arch = loads_arch(uniform)
    assert loads_arch(dump_yaml(arch)) == arch and arch.is_canonical


@pytest.mark.parametrize("weights, path, message", [
    ("[0.5, 0.25, 0.25]", "weights", "3 weights for 2 options; give one probability per option"),
    ("[0.5, 0.6]", "weights", "weights sum to 1.1, not 1"),
    ("[-0.5, 1.5]", "weights[0]", "should be at least 0 (got -0.5)"),
])
def test_bad_switch_weights_name_the_field(weights, path, message):
    text = f"""
model: {{vocab_size: 256, width: 64}}
random_placement: {{ratio: {{gdn: 1, attn: 1}}, placement: random}}
layers:
  - mixer: {{kind: switch, weights: {weights}, options: [{{kind: gdn, num_heads: 2, head_dim: 32}},
                                                      {{kind: attn, num_heads: 4}}]}}
  - mixer: {{kind: gdn, num_heads: 2, head_dim: 32}}
"""
    with pytest.raises(SpecError) as exc:
        loads_arch(text)
    (problem,) = exc.value.problems
    assert problem.path == f"layers[0].mixer.{path}" and message in problem.message


def test_sampling_needs_random_placement():
    with pytest.raises(SpecError, match=r"hybrid\.sampling: applies only to placement: random"):
        loads_arch(RANDOM.replace("placement: random", "placement: interleave, sampling: uniform"))
    with pytest.raises(SpecError, match=r"hybrid\.sampling_per: applies only to placement: random"):
        loads_arch(RANDOM.replace("placement: random", "placement: interleave, sampling_per: step"))
    with pytest.raises(SpecError, match=r"hybrid\.sampling_per"):
        loads_arch(RANDOM.replace("placement: random", "placement: random, sampling_per: batch"))


def _pattern_flops(arch, pattern) -> float:
    """Mixer projection FLOPs of one forward pass that runs ``pattern``'s options."""
    d, apps = arch.model.width, applications(arch)
    return sum(2 * apps[OpAddr(layer=i, op="mixer")] * op_active_params(l.mixer.options[o], d)
               for i, (l, o) in enumerate(zip(arch.layers, pattern)))


@pytest.mark.parametrize("sampling", ["ratio", "uniform"])
def test_cost_is_the_executors_average_pattern(sampling):
    """The model's own sampler, drawn many times: each layer runs option i with the
    switch's weights, so the mean mixer FLOPs of the drawn patterns converge on the
    cost sheet's; ratio patterns always hold the ratio's counts, uniform ones need not."""
    from builders.model import build_model

    torch.set_num_threads(1)
    six = RANDOM.replace("num_layers: 4", "num_layers: 6").replace("attn: 1, gdn: 1", "attn: 1, gdn: 3")
    arch = loads_arch(six.replace("placement: random", f"placement: random, sampling: {sampling}")
                      + "loop: {boundary: mixer, T: 2}\n")
    model = build_model(arch, backend="torch")
    torch.manual_seed(0)
    patterns = [model._pattern() for _ in range(4000)]
    flops = torch.tensor([_pattern_flops(arch, p) for p in patterns], dtype=torch.float64)
    expected = cost(arch).figures.projection.mixer
    assert abs(flops.mean().item() - expected) <= 4 * flops.std().item() / len(patterns) ** 0.5 + 1e-9 * expected
    freq = torch.tensor(patterns, dtype=torch.float64).mean(0)  # P(option 1) per layer
    assert torch.allclose(freq, torch.full((6,), arch.layers[0].mixer.weights[1], dtype=torch.float64),
                          atol=0.03)
    attn_layers = {p.count(0) for p in patterns}
    assert attn_layers == {2} if sampling == "ratio" else len(attn_layers) > 3
    assert projection_flops(arch).mixer == expected


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


# runners' rooms (issue 22): the proxy (a run of one model), what measures a model, the
# search (sweeps, one-shot, calibration: they train through the proxy), the experiment as
# recorded and read (records, statuses, the front: issue #33), what reads results,
# what inspects a run, and the CLI above all of them.
ROOMS = {
    "proxy": ("runners.train", "runners.tasks", "runners.elastic", "runners.checkpoint", "runners.weights", "runners.nogc"),
    "measure": ("runners.bench",),
    "experiment": ("runners.results",),
    "search": ("runners.sweep", "runners.oneshot", "runners.calibrate", "runners.transfer", "runners.track"),
    "results": ("runners.report", "runners.export"),
    "inspect": ("runners.diagnose", "runners.render"),
    "cli": ("runners.cli", "runners.__main__"),
}

# the order of the README's Layout table: each room may import only those before it
ORDER = ("nas", "builders", "proxy", "measure", "experiment", "search", "inspect", "results", "cli")


def _room(module: str) -> str | None:
    for top in ("nas", "builders", "spaces"):
        if module == top or module.startswith(top + "."):
            return top
    return next((room for room, prefixes in ROOMS.items()
                 if any(module == p or module.startswith(p + ".") for p in prefixes)), None)


def test_no_import_cycle_between_rooms_and_no_upward_import():
    """Every import counts, a function-level one too (a lazy import only hides a cycle):
    nas imports neither builders nor runners, builders not runners, and the rooms of runners
    form no cycle (train used to import the one-shot package for its weight mapping, which
    imports train)."""
    g = nx.DiGraph()
    for top in ("nas", "builders", "runners"):
        for path in (ROOT / top).rglob("*.py"):
            mod = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            if mod == "runners":  # the empty package file
                continue
            here = _room(mod)
            assert here is not None, f"{mod}: in no room of tests/project/test_canonical.py ROOMS"
            for dep in _imports(path, "nas") | _imports(path, "builders") | _imports(path, "runners"):
                there = _room(dep)
                if there is not None and there != here:
                    g.add_edge(here, there, example=(mod, dep))
    upward = [(a, b, g.edges[a, b]["example"]) for a, b in g.edges
              if a == "nas" or (a == "builders" and b not in ("nas", "spaces"))]
    assert upward == []
    # the README's "Layout" table: a room imports only the rooms before it
    backward = [(a, b, g.edges[a, b]["example"]) for a, b in g.edges
                if "spaces" not in (a, b) and ORDER.index(b) > ORDER.index(a)]
    assert backward == []
    cycles = [[(a, g.edges[a, b]["example"]) for a, b in zip(c, c[1:] + c[:1])] for c in nx.simple_cycles(g)]
    assert cycles == []


def test_the_readmes_layout_table_lists_the_rooms_in_their_import_order():
    text = (ROOT / "README.md").read_text()
    table = text.split("### Layout: the rooms and what each may import", 1)[1].split("\n\n")[2]
    rooms = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert tuple(rooms) == ORDER
