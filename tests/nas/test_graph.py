"""Graph views: application counts, back-edges, structural checks, text formats, pictures."""
import re
import subprocess
import sys
from collections import Counter

import networkx as nx
import pytest

import nas.graph
from nas.graph import folded_graph, graph_problems, to_dot, to_mermaid, unrolled_graph
from nas.load import load_arch, loads_arch
from nas.spec import LoopRegion, OpAddr
from runners.cli import main
from runners.render import render
from spaces import arch_names

from helpers import arch

NESTED = """
name: nested
model: {vocab_size: 256, width: 64, defaults: {gdn: {num_heads: 2, head_dim: 32, expand_v: 1}}}
num_layers: 3
layer: {mixer: {kind: gdn}, ffn: {kind: swiglu}}
loop:
  - {boundary: block, T: 2}
  - {boundary: selective, select: {ops: [mixer, ffn], layers: [1, 1]}, unit: span, T: 3,
     update: {kind: gated_step}}
  - {boundary: mixer, T: 5, update: {kind: residual_gate, shared: true}}
"""


def sublayer_runs(g) -> Counter:
    return Counter((d["layer"], d["op"]) for _, d in g.nodes(data=True) if d["op"] in ("mixer", "ffn"))


def ops(g, op):
    return [d for _, d in g.nodes(data=True) if d["op"] == op]


# ---------------------------------------------------------------- unrolled graph


@pytest.mark.parametrize("name, mixers, ffns", [
    ("mixerloop_15m", 6 * 4, 6),
    ("fullloop_15m", 4 * 6, 4 * 6),
    ("noloop_15m", 6, 6),
])
def test_paper_configs_application_counts(name, mixers, ffns):
    g = unrolled_graph(arch(name))
    assert len(ops(g, "mixer")) == mixers
    assert len(ops(g, "ffn")) == ffns


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_elr_runs_prelude_k_recurrent_and_coda(k):
    a = arch("elr_hybrid")
    g = unrolled_graph(a, loops=k)
    runs = sublayer_runs(g)
    assert len(ops(g, "mixer")) == len(ops(g, "ffn")) == 2 + 4 * k + 2
    assert all(runs[(i, "mixer")] == (k if 2 <= i <= 5 else 1) for i in range(8))
    # the gated step starts at the second iteration: one loop is the plain model
    assert len(ops(g, "update")) == k - 1
    assert len(ops(g, "condition")) == k


def test_selective_repeats_only_gdn_mixers():
    a = arch("tiny_selective")
    runs = sublayer_runs(unrolled_graph(a))
    repeated = {key for key, n in runs.items() if n > 1}
    gdn_mixers = {(i, "mixer") for i, l in enumerate(a.layers) if l.mixer.kind == "gdn"}
    assert repeated == gdn_mixers and len(gdn_mixers) == 3
    assert all(runs[key] == 3 for key in gdn_mixers)


@pytest.mark.parametrize("name", arch_names())
def test_param_groups_are_the_physical_sublayers(name):
    a = arch(name)
    g = unrolled_graph(a)
    groups = {d["param_group"] for _, d in g.nodes(data=True) if d["op"] in ("mixer", "ffn")}
    assert len(groups) == 2 * a.L
    by_group = {}
    for _, d in g.nodes(data=True):
        if d["param_group"] is not None:
            by_group.setdefault(d["param_group"], set()).add(d["kind"])
    assert all(len(kinds) == 1 for kinds in by_group.values())


def test_mixerloop_gate_is_one_shared_group_reading_the_previous_state():
    g = unrolled_graph(arch("mixerloop_15m"))
    gates = [n for n, d in g.nodes(data=True) if d["op"] == "update"]
    assert len(gates) == 6 * 4
    assert {g.nodes[n]["param_group"] for n in gates} == {"rho"}
    for n in gates:
        (state,) = [a for a, _, f in g.in_edges(n, data="flow") if f == "state"]
        (stream,) = [a for a, _, f in g.in_edges(n, data="flow") if f == "stream"]
        assert g.nodes[stream]["op"] == "mixer"          # f(h_{τ-1})
        assert g.nodes[state]["op"] in ("embed", "ffn", "update")  # h_{τ-1}


def test_reinjection_reads_the_region_input():
    g = unrolled_graph(arch("tiny_parallel"))
    reinject = [n for n, d in g.nodes(data=True) if d["op"] == "reinject"]
    assert len(reinject) == 2 * (2 - 1)
    sources = {a for n in reinject for a, _, f in g.in_edges(n, data="flow") if f == "input"}
    assert sources == {"embed", "layers.0.ffn"}


def test_reinjection_from_the_first_iteration_and_iteration_norms():
    """tiny_huginn re-injects before each of its 4 iterations (the first reads the region
    input on the stream); tiny_ouro normalises after each of its 4 iterations."""
    g = unrolled_graph(arch("tiny_huginn"))
    reinject = sorted((d["order"], n) for n, d in g.nodes(data=True) if d["op"] == "reinject")
    assert len(reinject) == 4 and {g.nodes[n]["param_group"] for _, n in reinject} == {"loops.0.reinject"}
    region_in = "layers.0.ffn"
    flows = [{f: a for a, _, f in g.in_edges(n, data="flow")} for _, n in reinject]
    assert flows[0] == {"stream": region_in}
    assert all(f["input"] == region_in and g.nodes[f["stream"]]["op"] == "ffn" for f in flows[1:])
    g = unrolled_graph(arch("tiny_ouro"))
    norms = [n for n, d in g.nodes(data=True) if d["op"] == "iteration_norm"]
    assert len(norms) == 4 and {g.nodes[n]["param_group"] for n in norms} == {"loops.0.norm"}
    assert nas.graph.loop_label(arch("tiny_ouro"), arch("tiny_ouro").loops[0]) == "×4 iteration norm"
    assert graph_problems(arch("tiny_huginn")) == [] and graph_problems(arch("tiny_ouro")) == []


def test_loop_level_schedule_sets_the_window_per_iteration():
    g = unrolled_graph(arch("tiny_coarse_to_fine"))
    windows = [d["overrides"].get("window") for _, d in sorted(g.nodes(data=True), key=lambda x: x[1]["order"])
               if d["op"] == "mixer" and d["layer"] == 0]
    assert windows == ["full", 32, 16, 8]


def test_nested_loops_multiply():
    a = loads_arch(NESTED)
    runs = sublayer_runs(unrolled_graph(a))
    assert runs[(0, "mixer")] == 2 * 5 and runs[(0, "ffn")] == 2
    assert runs[(1, "mixer")] == 2 * 3 * 5 and runs[(1, "ffn")] == 2 * 3


# ---------------------------------------------------------------- folded graph


def back_edges(g):
    return [(a, b, e) for a, b, e in g.edges(data=True) if e["back"]]


@pytest.mark.parametrize("name", arch_names())
def test_one_back_edge_per_region_labelled_with_T(name):
    a = arch(name)
    g = folded_graph(a)
    back = back_edges(g)
    assert len(back) == len(a.loops)
    for end, start, e in back:
        r = a.loops[e["loop"]]
        assert (end, start) == (f"layers.{r.end.layer}.{r.end.op}", f"layers.{r.start.layer}.{r.start.op}")
        assert e["label"].startswith(f"×{r.T}")
    forward = nx.DiGraph([(x, y) for x, y, e in g.edges(data=True) if not e["back"]])
    assert list(nx.topological_sort(forward))[0] == "embed"
    assert len(g) == 2 * a.L + 2


def test_folded_labels_name_update_rules_and_elr_parts():
    (_, _, e), = back_edges(folded_graph(arch("fullloop_15m")))
    assert e["label"] == "×4 ρ-gate"
    g = folded_graph(arch("elr_hybrid"))
    (end, start, e), = back_edges(g)
    assert (end, start) == ("layers.5.ffn", "layers.2.mixer") and "gated step" in e["label"]
    parts = Counter(d["part"] for _, d in g.nodes(data=True) if d["layer"] is not None)
    assert parts == {"prelude": 4, "recurrent": 8, "coda": 4}
    for name in ("mixerloop_15m", "fullloop_15m", "noloop_15m"):
        assert all(d["part"] is None for _, d in folded_graph(arch(name)).nodes(data=True))
    labels = {e["label"] for _, _, e in back_edges(folded_graph(arch("tiny_parallel")))}
    assert labels == {"×2 re-inject add"}


def test_nested_regions_give_nested_back_edges():
    a = loads_arch(NESTED)
    g = folded_graph(a)
    back = {e["T"]: (end, start, e["level"]) for end, start, e in back_edges(g)}
    order = {n: i for i, n in enumerate(g.nodes)}
    outer, middle = back[2], back[3]
    inner = [(x, y, e) for x, y, e in back_edges(g) if e["T"] == 5]
    assert len(inner) == 3 and all(x == y and e["level"] == 1 for x, y, e in inner)
    assert outer[2] == 3 and middle[2] == 2
    assert order[outer[1]] <= order[middle[1]] <= order[middle[0]] <= order[outer[0]]


ELR = """
name: long_elr
model: {vocab_size: 256, width: 64, defaults: {gdn: {num_heads: 2, head_dim: 32, expand_v: 1}, attn: {num_heads: 4}}}
num_layers: 40
hybrid: {ratio: {attn: 1, gdn: 3}, placement: interleave}
loop: {boundary: elr, prelude: 10, recurrent: 20, coda: 10, T: 3, update: {kind: gated_step}}
"""


def test_folded_graph_is_the_same_whatever_the_spec_size():
    """Each sublayer's regions (outermost first), schedule and labels, against their
    definition (the graph computes them in one pass, not per sublayer and region)."""
    for a in [arch(n) for n in arch_names()] + [loads_arch(NESTED)]:
        g = folded_graph(a)
        for i in range(a.L):
            for op in ("mixer", "ffn"):
                flat = 2 * i + (op == "ffn")
                inside = [j for j, r in enumerate(a.loops) if r.start.flat <= flat <= r.end.flat]
                want = tuple(sorted(inside, key=lambda j: a.loops[j].start.flat - a.loops[j].end.flat))
                assert g.nodes[f"layers.{i}.{op}"]["loops"] == want, (a.name, i, op)
        for _, _, e in back_edges(g):
            assert e["update"] == nas.graph.update_label(a, a.loops[e["loop"]])
    mixer = loads_arch(NESTED.replace("num_layers: 3", "num_layers: 2"))
    assert [e["label"] for *_, e in back_edges(folded_graph(mixer))].count("×5 ρ-gate, shared") == 2


def test_a_short_stack_is_not_elided():
    g = folded_graph(arch("elr_hybrid"))
    assert nas.graph.elide(g) is g and g.graph["elided"] == 0


def test_a_long_stack_draws_its_ends_and_elides_the_middle_per_part():
    a = loads_arch(ELR)
    g = nas.graph.elide(folded_graph(a), max_layers=8)
    assert g.graph["elided"] == 32
    drawn = sorted({d["layer"] for _, d in g.nodes(data=True) if d["layer"] is not None})
    assert drawn == [0, 1, 2, 3, 36, 37, 38, 39]
    elided = [(n, d) for n, d in g.nodes(data=True) if d["op"] == "elided"]
    assert [(n, d["layers"], d["part"]) for n, d in elided] == [
        ("layers.4-9", (4, 9), "prelude"), ("layers.10-29", (10, 29), "recurrent"),
        ("layers.30-35", (30, 35), "coda")]
    assert elided[1][1]["label"] == "⋮ 20 layers (10–29)"
    assert elided[1][1]["detail"] == "15 gdn, 5 attn · 1 loop region"
    assert set(elided[1][1]["branches"]) == {"gdn", "attn"}
    (end, start, e), = back_edges(g)  # the recurrent loop, wholly elided, keeps its arc
    assert end == start == "layers.10-29" and e["label"] == "×3 gated step"
    order = list(g.nodes)
    forward = [(x, y) for x, y, e in g.edges(data=True) if not e["back"]]
    assert forward == list(zip(order, order[1:])) and order[0] == "embed" and order[-1] == "head"


def test_elided_back_edges_attach_to_the_elided_node():
    a = loads_arch(NESTED.replace("num_layers: 3", "num_layers: 12"))  # block ×2, layer 1 ×3, mixers ×5
    g = nas.graph.elide(folded_graph(a), max_layers=4)
    ends = {(x, y): e for x, y, e in back_edges(g)}
    assert ends[("layers.11.ffn", "layers.0.mixer")]["T"] == 2   # kept ends, kept edge
    assert ends[("layers.1.ffn", "layers.1.mixer")]["T"] == 3
    assert ends[("layers.2-9", "layers.2-9")]["T"] == 5           # one arc for the 8 elided mixer loops
    assert g.nodes["layers.2-9"]["detail"] == "8 gdn · 8 loop regions"
    assert sum(e["T"] == 5 for e in ends.values()) == 1 + 4      # and one per drawn mixer


def test_an_elided_graph_draws_and_writes_text(tmp_path):
    from runners.render import draw
    g = nas.graph.elide(folded_graph(loads_arch(ELR)), max_layers=8)
    draw(g).savefig(tmp_path / "e.png", dpi=50)
    assert (tmp_path / "e.png").stat().st_size > 1000
    assert "⋮ 20 layers (10–29)" in to_dot(g) and "⋮ 20 layers (10–29)" in to_mermaid(g)


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize("name", arch_names())
def test_shipped_specs_have_no_graph_problems(name):
    assert graph_problems(arch(name)) == []


def region(a, b, T):
    return LoopRegion(start=OpAddr(layer=a[0], op=a[1]), end=OpAddr(layer=b[0], op=b[1]), T=T)


def test_overlapping_regions_are_caught_on_the_graph():
    a = arch("tiny_noloop")
    bad = a.model_copy(update={"loops": (region((0, "mixer"), (0, "ffn"), 2),
                                         region((0, "ffn"), (1, "mixer"), 3))})
    paths = {p.path for p in graph_problems(bad)}
    assert "layers[1].mixer" in paths


def test_reversed_region_is_caught_on_the_graph():
    a = arch("tiny_noloop")
    bad = a.model_copy(update={"loops": (region((1, "mixer"), (0, "mixer"), 2),)})
    assert graph_problems(bad)


@pytest.mark.parametrize("damage", ["cycle", "kinds", "chain"])
def test_broken_graphs_are_reported(monkeypatch, damage):
    a = arch("tiny_fullloop")
    g = unrolled_graph(a)
    if damage == "cycle":
        g.add_edge("head", "embed", flow="state")
    elif damage == "kinds":
        g.nodes["layers.0.mixer@0:1"]["kind"] = "attn"
    else:
        g.remove_edge("norm", "head")
    monkeypatch.setattr(nas.graph, "unrolled_graph", lambda arch, loops=None: g)
    problems = graph_problems(a)
    assert problems
    if damage == "kinds":
        assert problems[0].path == "layers.0.mixer"


# ---------------------------------------------------------------- text formats


@pytest.mark.parametrize("name", ["mixerloop_15m", "elr_hybrid", "tiny_parallel", "lt2_coarse_to_fine"])
def test_dot_declares_every_node_and_edge(name):
    g = folded_graph(arch(name))
    text = to_dot(g)
    assert text.startswith("digraph") and text.count("{") == text.count("}")
    declared = set(re.findall(r'^\s*"([^"]+)" \[label=', text, flags=re.M))
    assert declared == set(g.nodes)
    edges = re.findall(r'^\s*"([^"]+)" -> "([^"]+)"', text, flags=re.M)
    assert sorted(edges) == sorted(g.edges)
    assert text.count("constraint=false") == len(back_edges(g))


@pytest.mark.parametrize("name", ["mixerloop_15m", "elr_hybrid", "tiny_parallel"])
def test_mermaid_declares_every_node_and_edge(name):
    g = folded_graph(arch(name))
    text = to_mermaid(g)
    assert text.startswith("flowchart BT\n")
    assert len(re.findall(r'^\s*n\d+\["', text, flags=re.M)) == len(g)
    assert len(re.findall(r"^\s*n\d+ --> n\d+$", text, flags=re.M)) == len(g) - 1
    assert len(re.findall(r"-\.->", text)) == len(back_edges(g))
    assert text.count("subgraph") == text.count("\n  end\n")


# ---------------------------------------------------------------- pictures and CLI


@pytest.mark.parametrize("name", arch_names())
def test_render_every_shipped_spec(tmp_path, name):
    png = render(arch(name), tmp_path / f"{name}.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    svg = render(arch(name), tmp_path / f"{name}.svg")
    assert "<svg" in svg.read_text()[:2000]


def test_render_rejects_an_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match="unknown output format"):
        render(arch("tiny_noloop"), tmp_path / "x.gif")


@pytest.mark.parametrize("suffix", [".png", ".svg", ".dot", ".mmd", ".mermaid"])
def test_cli_graph_writes_the_file(tmp_path, suffix):
    out = tmp_path / f"g{suffix}"
    assert main(["graph", "tiny_mixerloop", "--out", str(out)]) == 0
    assert out.stat().st_size > 0


def test_cli_graph_bad_suffix_is_a_usage_error(tmp_path, capsys):
    assert main(["graph", "tiny_mixerloop", "--out", str(tmp_path / "g.gif")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and ".gif" in err[0]
    assert not (tmp_path / "g.gif").exists()


def test_cli_graph_defaults_to_the_spec_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["graph", "tiny_elr"]) == 0
    assert (tmp_path / "tiny_elr.png").stat().st_size > 0


def test_cli_graph_does_not_import_torch(tmp_path):
    code = ("import sys; from runners.cli import main; "
            f"rc = main(['graph', 'elr_hybrid', '--out', {str(tmp_path / 'e.png')!r}]); "
            "heavy = [m for m in ('torch', 'fla', 'ray') if m in sys.modules]; "
            "print(rc, heavy); sys.exit(rc or bool(heavy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
