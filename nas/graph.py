"""Graph views of a canonical spec, as networkx digraphs, and checks made on them.

- :func:`unrolled_graph`: one node per op application (embedding, every sublayer
  application, every loop-update and conditioning application, final norm, head); edges
  are data flow: the residual stream in execution order (``flow="stream"``), plus the
  state before an iteration read by a residual gate or gated step (``flow="state"``) and
  the region input read by re-injection (``flow="input"``).
- :func:`folded_graph`: one node per physical sublayer (plus embedding and head),
  forward edges in execution order and one back-edge per loop region, from its last op
  to its first, labelled ``×T`` and the update rule.

Both walk :func:`nas.plan.plan`, the structure the cost model and the executor use, and
draw each loop rule where :mod:`nas.rules` says it runs (re-injection and conditioning on
entering an iteration, the residual gate after every iteration, the gated step after every
iteration but the first, the iteration norm after the update). ``param_group`` follows the
model's parameter names.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import networkx as nx

from .errors import Problem
from .plan import Loop, Node, Step, applications, iteration_overrides, plan
from .rules import GraphStep, rules_of
from .spec import (
    ArchSpec, AttnSpec, DSASpec, IterOverride, LoopRegion, MoESpec, NSASpec, OpAddr, ParallelSpec,
    SwitchSpec, sub_mixers,
)

LoopPath = tuple[tuple[int, int], ...]
PARTS = ("prelude", "recurrent", "coda")

# One fill per op variant: attention warm, linear mixers cool, FFNs grey.
COLORS = {
    "attn": "#d6604d", "swa": "#f4a582", "dsa": "#e6863b", "nsa": "#fdd49e",
    "gdn": "#6baed6", "kda": "#9ecae1", "deltanet": "#74c7b8", "mamba2": "#9e9ac8",
    "swiglu": "#c8c8c8", "moe": "#969696", "none": "#f2f2f2",
    "embedding": "#e8dfc4", "head": "#e8dfc4",
}
LOOP_COLORS = ("#c51b7d", "#542788", "#01665e", "#8c510a")


def variant(op) -> str:
    """Colour key of an op: its kind, with windowed attention as ``swa``."""
    if isinstance(op, AttnSpec) and op.window is not None:
        return "swa"
    return op.kind


def describe(op) -> str:
    """Short label of a mixer or FFN spec: ``gdn``, ``swa 512``, ``attn ∥ gdn``,
    ``attn ∥ gdn (norm, β)`` (per-branch norm and scale)."""
    if isinstance(op, ParallelSpec):
        extras = [w for w, on in (("norm", op.branch_norm), ("β", op.branch_scale)) if on]
        return " ∥ ".join(describe(b) for b in op.branches) + (f" ({', '.join(extras)})" if extras else "")
    if isinstance(op, SwitchSpec):
        return "switch " + " / ".join(describe(b) for b in op.options)
    if isinstance(op, AttnSpec):
        return f"swa {op.window}" if op.window is not None else "attn"
    if isinstance(op, DSASpec):
        return f"dsa top-{op.topk}"
    if isinstance(op, NSASpec):
        return f"nsa w={op.window}"
    if isinstance(op, MoESpec):
        return f"moe {op.num_experts}e top-{op.top_k}"
    return op.kind


def _branches(op) -> tuple[str, ...]:
    sub = sub_mixers(op)
    return tuple(variant(b) for b in sub[1]) if sub is not None else ()


def update_label(arch: ArchSpec, r: LoopRegion) -> str:
    """The region's rules in a few words (``ρ-gate``, ``gated step``, ``re-inject add``,
    ``index cond``, each from its :mod:`nas.rules` module), then routing replay and
    truncated backpropagation."""
    words = [rule.label(r, arch) for rule in rules_of(r)] + ["routing replay" if r.routing_replay else "",
                                                            f"backprop last {r.truncate}" if r.truncate else ""]
    return ", ".join(w for w in words if w)


class _Labels:
    """:func:`update_label` of the regions of one spec, each computed once per distinct
    region up to its place (``start``, ``end`` and the layers its ``schedule`` names): a
    rule's label may look at every region of the spec (the residual gate counts the shared
    ones), so labelling the 4096 regions of a MixerLoop one by one is quadratic."""

    PLACE = frozenset({"start", "end", "schedule"})

    def __init__(self, arch: ArchSpec):
        self.arch, self.memo = arch, {}

    def __call__(self, r: LoopRegion) -> str:
        key = tuple((k, v) for k, v in r if k not in self.PLACE)
        if key not in self.memo:
            self.memo[key] = update_label(self.arch, r)
        return self.memo[key]


def loop_label(arch: ArchSpec, r: LoopRegion, paren: bool = False, labels: _Labels | None = None) -> str:
    """``×4 ρ-gate``; with ``paren``, ``×4 (ρ-gate)``."""
    rule = (labels or _Labels(arch))(r)
    if not rule:
        return f"×{r.T}"
    return f"×{r.T} ({rule})" if paren else f"×{r.T} {rule}"


def _short(op) -> str:
    if isinstance(op, (ParallelSpec, SwitchSpec)):
        return ("∥" if isinstance(op, ParallelSpec) else "/").join(_branches(op))
    return variant(op)


def _count(items: list[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in Counter(items).items())


def _span_text(arch: ArchSpec, r: LoopRegion) -> str:
    if (r.start.flat, r.end.flat) == (0, 2 * arch.L - 1):
        return "whole stack"
    if r.start.op == "mixer" and r.end.op == "ffn":
        return (f"layer {r.start.layer}" if r.start.layer == r.end.layer
                else f"layers {r.start.layer}–{r.end.layer}")
    return f"{r.start} .. {r.end}"


def _regions_text(arch: ArchSpec, indices: list[int], labels: _Labels) -> str:
    groups: dict[tuple, list[LoopRegion]] = defaultdict(list)
    for i in indices:
        r = arch.loops[i]
        kind = getattr(arch.layers[r.start.layer], r.start.op).kind if r.start == r.end else None
        groups[(kind, r.start.op, loop_label(arch, r, True, labels))].append(r)
    texts = []
    for (kind, op, label), rs in groups.items():
        if kind is not None:
            texts.append(f"{len(rs)} {kind} {op}{'s' if len(rs) > 1 else ''} {label}")
        else:
            texts += [f"{_span_text(arch, r)} {label}" for r in rs]
    return "; ".join(texts)


def loops_summary(arch: ArchSpec, labels: _Labels | None = None, nodes: tuple[Node, ...] | None = None) -> str:
    """One line: ``6 gdn mixers ×4 (ρ-gate)``, ``prelude 2 · recurrent 4 ×4 (…) · coda 2``
    (``nodes``: the spec's :func:`nas.plan.plan`, when the caller has it)."""
    nodes = plan(arch) if nodes is None else nodes
    parts, labels = elr_parts(arch, nodes), labels or _Labels(arch)
    if not arch.loops:
        text = "no loop"
    elif parts:
        n = {p: sum(v == p for v in parts.values()) for p in PARTS}
        top = next(node.index for node in nodes if isinstance(node, Loop))
        inner = _regions_text(arch, [i for i in range(len(arch.loops)) if i != top], labels)
        text = (f"prelude {n['prelude']} · recurrent {n['recurrent']} "
                f"{loop_label(arch, arch.loops[top], True, labels)}" + (f" [{inner}]" if inner else "")
                + f" · coda {n['coda']}")
    else:
        text = _regions_text(arch, list(range(len(arch.loops))), labels)
    if arch.elastic is not None:
        text += f" · elastic k∈{{{','.join(map(str, arch.elastic.eval))}}}"
    return text


def summary(arch: ArchSpec, loops: str | None = None) -> str:
    """One line for a title: layers, width, mixers and loops (``loops``: the
    :func:`loops_summary` when the caller has it)."""
    mixers = _count([_short(l.mixer) for l in arch.layers])
    layers = f"{arch.L} layer{'s' if arch.L != 1 else ''}"
    return f"{layers} ({mixers}), width {arch.model.width} · {loops or loops_summary(arch)}"


def elr_parts(arch: ArchSpec, nodes: tuple[Node, ...] | None = None) -> dict[int, str]:
    """ELR form (one top-level loop over whole layers, with layers outside it): the part
    of each layer, ``prelude`` / ``recurrent`` / ``coda``; empty for any other form."""
    tops = [n for n in (plan(arch) if nodes is None else nodes) if isinstance(n, Loop)]
    if len(tops) != 1:
        return {}
    r = tops[0].region
    whole = (r.start.flat, r.end.flat) == (0, 2 * arch.L - 1)
    if whole or r.start.op != "mixer" or r.end.op != "ffn":
        return {}
    return {i: "prelude" if i < r.start.layer else "coda" if i > r.end.layer else "recurrent"
            for i in range(arch.L)}


def loop_levels(arch: ArchSpec, nodes: tuple[Node, ...] | None = None) -> dict[int, int]:
    """Nesting height of each region: 1 for a region with no loop inside, else one more
    than its tallest inner region (so nested back-edges are drawn further out)."""
    levels: dict[int, int] = {}

    def height(nodes: tuple[Node, ...]) -> int:
        best = 0
        for n in nodes:
            if isinstance(n, Loop):
                levels[n.index] = 1 + height(n.body)
                best = max(best, levels[n.index])
        return best

    height(plan(arch) if nodes is None else nodes)
    return levels


def _expected_runs(arch: ArchSpec, addr: OpAddr, loops: int | None) -> int:
    return math.prod(loops if loops is not None else r.T for r in arch.loops
                     if r.start.flat <= addr.flat <= r.end.flat)


class _Unroller:
    """Walks a plan, adding one node per application and the data-flow edges."""

    def __init__(self, arch: ArchSpec):
        self.arch, self.g = arch, nx.DiGraph(name=arch.name)

    def add(self, base: str, path: LoopPath, prev: str | None, **attrs) -> str:
        nid = base + ("@" + ",".join(f"{i}:{t}" for i, t in path) if path else "")
        if nid in self.g:
            nid += f"#{self.g.number_of_nodes()}"
        self.g.add_node(nid, order=self.g.number_of_nodes(), path=path, **attrs)
        if prev is not None:
            self.g.add_edge(prev, nid, flow="stream")
        return nid

    def overrides(self, addr: OpAddr, path: LoopPath) -> dict:
        return iteration_overrides(self.arch, addr.layer, path) if addr.op == "mixer" else {}

    def step(self, addr: OpAddr, path: LoopPath, cur: str) -> str:
        op = getattr(self.arch.layers[addr.layer], addr.op)
        return self.add(f"layers.{addr.layer}.{addr.op}", path, cur, layer=addr.layer, op=addr.op,
                        kind=op.kind, variant=variant(op), label=describe(op),
                        param_group=f"layers.{addr.layer}.{addr.op}",
                        overrides=self.overrides(addr, path))

    def extra(self, i: int, what: str, kind: str, group: str | None, path: LoopPath, cur: str) -> str:
        return self.add(f"loops.{i}.{what}", path, cur, layer=None, op=what, kind=kind,
                        variant=kind, label=kind, param_group=group, overrides={}, loop=i)

    def rule_node(self, i: int, g: GraphStep, path: LoopPath, cur: str, other: str) -> str:
        """A rule's node (:class:`nas.rules.GraphStep`); ``other``: the node its extra edge
        reads (the region input or the state before the iteration)."""
        group = None if g.group is None else (g.group if g.shared else f"loops.{i}.{g.group}")
        nid = self.extra(i, g.what, g.kind, group, path, cur)
        if g.edge is not None and other != cur:  # (re-injection into the first iteration: one edge)
            self.g.add_edge(other, nid, flow=g.edge)
        return nid

    def loop(self, n: Loop, path: LoopPath, cur: str) -> str:
        r, i, region_in = n.region, n.index, cur
        rules = rules_of(r)
        for t in range(n.T):
            p, prev = path + ((i, t),), cur
            for g in (g for rule in rules for g in rule.before(r, t)):
                cur = self.rule_node(i, g, p, cur, region_in)
            cur = self.walk(n.body, p, cur)
            for g in (g for rule in rules for g in rule.after(r, t)):
                cur = self.rule_node(i, g, p, cur, prev)
        return cur

    def walk(self, nodes: tuple[Node, ...], path: LoopPath, cur: str) -> str:
        for n in nodes:
            cur = self.step(n.addr, path, cur) if isinstance(n, Step) else self.loop(n, path, cur)
        return cur


def unrolled_graph(arch: ArchSpec, loops: int | None = None) -> nx.DiGraph:
    """Every op application of one forward pass (``loops=k`` runs every region k times).

    Node attributes: ``order``, ``layer`` (None outside layers), ``op`` (``embed``,
    ``mixer``, ``ffn``, ``reinject``, ``condition``, ``update``, ``iteration_norm``,
    ``norm``, ``head``), ``kind``, ``variant``, ``label``, ``path`` (``((loop index, iteration), ...)``,
    outermost first), ``param_group`` (None for parameter-free ops) and ``overrides``
    (the loop-level schedule at that iteration, e.g. ``{"window": 512}``).
    """
    u = _Unroller(arch)
    tied = arch.model.tie_embeddings
    cur = u.add("embed", (), None, layer=None, op="embed", kind="embedding", variant="embedding",
                label="embedding", param_group="embed", overrides={})
    cur = u.walk(plan(arch, loops), (), cur)
    cur = u.add("norm", (), cur, layer=None, op="norm", kind=arch.model.norm.kind,
                variant="head", label="norm", param_group="norm", overrides={})
    u.add("head", (), cur, layer=None, op="head", kind="embedding" if tied else "linear",
          variant="head", label="head (tied)" if tied else "head",
          param_group="embed" if tied else "lm_head", overrides={})
    return u.g


def _schedules(arch: ArchSpec) -> list[dict[int, dict[int, IterOverride]]]:
    """Per region, its schedule by layer, then iteration (one pass over every schedule;
    LT2's coarse-to-fine has an entry per attention mixer and iteration)."""
    out: list[dict[int, dict[int, IterOverride]]] = []
    for r in arch.loops:
        by_layer: dict[int, dict[int, IterOverride]] = defaultdict(dict)
        for o in r.schedule:
            by_layer[o.layer][o.iteration] = o
        out.append(by_layer)
    return out


def _schedule(arch: ArchSpec, layer: int, regions: tuple[int, ...],
              schedules: list[dict[int, dict[int, IterOverride]]]) -> str:
    """Per-iteration windows / top-k of a scheduled mixer: ``full→512→256→128``
    (``schedules``: :func:`_schedules`)."""
    base = arch.layers[layer].mixer
    for i in regions:
        r = arch.loops[i]
        entries = schedules[i].get(layer, {})
        if not entries:
            continue
        field = "topk" if isinstance(base, DSASpec) else "window"
        own = getattr(base, field, None)
        values = [getattr(entries[t], field) if t in entries and getattr(entries[t], field) is not None
                  else (own if own is not None else "full") for t in range(r.T)]
        return ("top-k " if field == "topk" else "w ") + "→".join(map(str, values))
    return ""


def _enclosing(arch: ArchSpec) -> list[tuple[int, ...]]:
    """The regions around each sublayer (by flat index), outermost first: one pass over
    the regions, each over its own span (a test per sublayer and region was quadratic)."""
    inside: list[list[int]] = [[] for _ in range(2 * arch.L)]
    spans = [(r.start.flat, r.end.flat) for r in arch.loops]
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0] - spans[i][1]):  # stable: ties by index
        for flat in range(spans[i][0], min(spans[i][1], 2 * arch.L - 1) + 1):
            inside[flat].append(i)
    return [tuple(regions) for regions in inside]


def folded_graph(arch: ArchSpec) -> nx.DiGraph:
    """One node per physical sublayer (plus ``embed`` and ``head``) in execution order;
    forward edges have ``back=False``; each loop region adds a back-edge (``back=True``)
    from its last op to its first with ``loop``, ``T``, ``update``, ``level`` (nesting
    height, 1 = innermost) and ``label`` (``×4 ρ-gate``). Node ``part`` is the ELR part
    (``prelude`` / ``recurrent`` / ``coda``) or None; ``runs`` counts applications."""
    nodes, labels = plan(arch), _Labels(arch)
    parts, levels, enclosing = elr_parts(arch, nodes), loop_levels(arch, nodes), _enclosing(arch)
    schedules = _schedules(arch)
    runs, loops = applications(arch), loops_summary(arch, labels, nodes)
    tied = arch.model.tie_embeddings
    g = nx.DiGraph(name=arch.name, summary=summary(arch, loops), loops=loops)
    g.add_node("embed", layer=None, op="embed", kind="embedding", variant="embedding",
               label="embedding", branches=(), part=None, runs=1, loops=(), schedule="")
    for i, layer in enumerate(arch.layers):
        for op_name in ("mixer", "ffn"):
            op, addr = getattr(layer, op_name), OpAddr(layer=i, op=op_name)
            regions = enclosing[addr.flat]
            g.add_node(f"layers.{i}.{op_name}", layer=i, op=op_name, kind=op.kind,
                       variant=variant(op), label=describe(op), branches=_branches(op),
                       part=parts.get(i), runs=runs[addr], loops=regions,
                       schedule=_schedule(arch, i, regions, schedules) if op_name == "mixer" else "")
    g.add_node("head", layer=None, op="head", kind="embedding" if tied else "linear",
               variant="head", label="norm → head" + (" (tied)" if tied else ""), branches=(),
               part=None, runs=1, loops=(), schedule="")
    order = list(g.nodes)
    g.add_edges_from(zip(order, order[1:]), back=False)
    for i, r in enumerate(arch.loops):
        g.add_edge(f"layers.{r.end.layer}.{r.end.op}", f"layers.{r.start.layer}.{r.start.op}",
                   back=True, loop=i, T=r.T, update=labels(r),
                   level=levels.get(i, 1), label=loop_label(arch, r, labels=labels))
    return g


MAX_DRAWN = 64  # layers a picture draws one by one (matplotlib takes minutes over thousands)


def elide(g: nx.DiGraph, max_layers: int = MAX_DRAWN) -> nx.DiGraph:
    """A folded graph with at most ``max_layers`` layers drawn one by one: past that, the
    first and last ``max_layers // 2`` layers stay and the layers between become one node
    per ELR part (``op="elided"``, ``layers=(first, last)``), labelled with their count and
    range, striped with their mixer variants (``detail``: their mixers and how many loop
    regions lie wholly inside them). A back-edge with an end among them ends at their node;
    of the regions that then share both ends (all those inside one such node, say), the
    outermost keeps its back-edge.
    ``g.graph["elided"]``: how many layers were elided (0: ``g`` itself is returned)."""
    layers = sorted({d["layer"] for _, d in g.nodes(data=True) if d["layer"] is not None})
    if len(layers) <= max_layers:
        g.graph.setdefault("elided", 0)
        return g
    keep = max(max_layers // 2, 1)
    hidden = set(layers[keep:-keep])
    runs: list[list[tuple[str, dict]]] = []  # consecutive elided sublayers of one part
    for n, d in g.nodes(data=True):
        if d["layer"] in hidden:
            if not runs or runs[-1][-1][1]["part"] != d["part"]:
                runs.append([])
            runs[-1].append((n, d))
    where = {n: f"layers.{run[0][1]['layer']}-{run[-1][1]['layer']}" for run in runs for n, _ in run}
    inner: Counter = Counter()
    back: dict[tuple[str, str], dict] = {}
    for a, b, e in g.edges(data=True):
        if not e.get("back"):
            continue
        ends = where.get(a, a), where.get(b, b)
        if a in where and ends[0] == ends[1]:
            inner[ends[0]] += 1
        if ends not in back or back[ends]["level"] < e["level"]:
            back[ends] = e
    out = nx.DiGraph(**{**g.graph, "elided": len(hidden)})
    runs_at = {run[0][0]: run for run in runs}
    for n, d in g.nodes(data=True):
        if n not in where:
            out.add_node(n, **d)
        elif n in runs_at:
            members = [m for _, m in runs_at[n]]
            node, first, end = where[n], members[0]["layer"], members[-1]["layer"]
            mixers = [m for m in members if m["op"] == "mixer"]
            kinds = [("/" if m["kind"] == "switch" else "∥").join(m["branches"]) or m["variant"] for m in mixers]
            regions = f" · {inner[node]} loop region{'s' * (inner[node] > 1)}" if inner[node] else ""
            out.add_node(node, layer=None, op="elided", kind="elided", variant="none",
                         label=f"⋮ {end - first + 1} layers ({first}–{end})", detail=_count(kinds) + regions,
                         branches=tuple(dict.fromkeys(v for m in mixers for v in m["branches"] or (m["variant"],))),
                         part=members[0]["part"], runs=sum(m["runs"] for m in members), loops=(), schedule="",
                         layers=(first, end))
    order = list(out.nodes)
    out.add_edges_from(zip(order, order[1:]), back=False)
    for (a, b), e in back.items():
        out.add_edge(a, b, **e)
    return out


def _q(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_text(d: dict) -> str:
    label = d["label"] if d["layer"] is None else f"{d['layer']} · {d['label']}"
    return label + (f" [{d['schedule']}]" if d.get("schedule") else "")


def _dot_node(n: str, d: dict) -> str:
    if d["branches"]:
        fill = ":".join(COLORS.get(b, "#ffffff") for b in d["branches"])
        return f"{_q(n)} [label={_q(_node_text(d))}, style=striped, fillcolor={_q(fill)}];"
    return f"{_q(n)} [label={_q(_node_text(d))}, fillcolor={_q(COLORS.get(d['variant'], '#ffffff'))}];"


def to_dot(g: nx.DiGraph) -> str:
    """Graphviz DOT of a folded graph, bottom (embedding) to top (head); ELR parts are
    clusters; back-edges are dashed, coloured by nesting level, and do not constrain rank."""
    name = g.graph.get("name", "arch")
    lines = [f"digraph {_q(name)} {{", "  rankdir=BT;", "  labelloc=t;",
             f"  label={_q(name + chr(10) + g.graph.get('summary', ''))};",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for part in (None, *PARTS):
        members = [(n, d) for n, d in g.nodes(data=True) if d.get("part") == part]
        if part is not None and members:
            lines.append(f"  subgraph cluster_{part} {{")
            lines.append(f'    label={_q(part)}; style="rounded,dashed"; color="#888888";')
        indent = "    " if part is not None else "  "
        lines += [indent + _dot_node(n, d) for n, d in members]
        if part is not None and members:
            lines.append("  }")
    for a, b, e in g.edges(data=True):
        if e.get("back"):
            color = LOOP_COLORS[(e["level"] - 1) % len(LOOP_COLORS)]
            lines.append(f"  {_q(a)} -> {_q(b)} [label={_q(e['label'])}, style=dashed, "
                         f"color={_q(color)}, fontcolor={_q(color)}, constraint=false];")
        else:
            lines.append(f"  {_q(a)} -> {_q(b)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mq(text: str) -> str:
    return '"' + str(text).replace('"', "#quot;") + '"'


def to_mermaid(g: nx.DiGraph) -> str:
    """Mermaid flowchart of a folded graph (bottom to top); ELR parts are subgraphs and
    back-edges dotted arrows labelled ``×T`` and the update rule."""
    ids = {n: f"n{k}" for k, n in enumerate(g.nodes)}
    lines = ["flowchart BT"]
    for part in (None, *PARTS):
        members = [(n, d) for n, d in g.nodes(data=True) if d.get("part") == part]
        if part is not None and members:
            lines.append(f"  subgraph {part}[{_mq(part)}]")
        indent = "    " if part is not None else "  "
        lines += [f"{indent}{ids[n]}[{_mq(_node_text(d))}]" for n, d in members]
        if part is not None and members:
            lines.append("  end")
    for a, b, e in g.edges(data=True):
        arrow = f" -.->|{_mq(e['label'])}| " if e.get("back") else " --> "
        lines.append(f"  {ids[a]}{arrow}{ids[b]}")
    by_variant: dict[str, list[str]] = defaultdict(list)
    for n, d in g.nodes(data=True):
        by_variant[(d["branches"] or (d["variant"],))[0]].append(ids[n])
    for v, members in by_variant.items():
        lines.append(f"  classDef k_{v} fill:{COLORS.get(v, '#ffffff')},stroke:#333333")
        lines.append(f"  class {','.join(members)} k_{v}")
    return "\n".join(lines) + "\n"


def _stream_chain(g: nx.DiGraph) -> list[Problem]:
    """The residual stream visits every node once, from the embedding to the head."""
    stream = nx.DiGraph([(a, b) for a, b, f in g.edges(data="flow") if f == "stream"])
    stream.add_nodes_from(g)
    starts = [n for n in stream if stream.in_degree(n) == 0]
    if len(starts) != 1 or g.nodes[starts[0]]["op"] != "embed":
        return [Problem("", f"the residual stream has {len(starts)} starts ({', '.join(starts[:3])}); "
                            "it must be one chain from the embedding to the head")]
    seen, cur = [starts[0]], starts[0]
    while stream.out_degree(cur) == 1 and len(seen) <= len(g):
        cur = next(iter(stream.successors(cur)))
        seen.append(cur)
    if len(set(seen)) != len(g) or g.nodes[cur]["op"] != "head" or stream.out_degree(cur):
        return [Problem("", f"the residual stream from the embedding stops at {cur} after "
                            f"{len(seen)} of {len(g)} applications; it must reach the head through all")]
    return []


def _coverage(arch: ArchSpec, g: nx.DiGraph) -> list[Problem]:
    runs: dict[OpAddr, int] = defaultdict(int)
    for _, d in g.nodes(data=True):
        if d["op"] in ("mixer", "ffn"):
            runs[OpAddr(layer=d["layer"], op=d["op"])] += 1
    out = []
    for i in range(arch.L):
        for op in ("mixer", "ffn"):
            addr = OpAddr(layer=i, op=op)
            want = _expected_runs(arch, addr, None)
            if runs[addr] != want:
                out.append(Problem(str(addr), f"runs {runs[addr]} times in the execution plan but "
                                              f"its enclosing loops imply {want}; check the loop regions"))
    return out


def _groups(g: nx.DiGraph) -> list[Problem]:
    kinds: dict[str, set[str]] = defaultdict(set)
    for _, d in g.nodes(data=True):
        if d["param_group"] is not None:
            kinds[d["param_group"]].add(d["kind"])
    return [Problem(group, f"weights shared by applications of different kinds "
                           f"({', '.join(sorted(ks))}); one parameter group must have one kind")
            for group, ks in kinds.items() if len(ks) > 1]


def graph_problems(arch: ArchSpec) -> list[Problem]:
    """Structural checks on the unrolled graph of a canonical spec: it is a DAG, the
    residual stream is one chain from embedding to head, each sublayer runs as often as
    its enclosing loops imply (at least once), and each parameter group has one kind.
    Regions addressing missing layers are left to :func:`nas.validate.loop_problems`."""
    if any(a.layer >= arch.L for r in arch.loops for a in (r.start, r.end)):
        return []
    g = unrolled_graph(arch)
    if not nx.is_directed_acyclic_graph(g):
        cycle = " -> ".join(a for a, _ in nx.find_cycle(g))
        return [Problem("", f"the unrolled graph has a cycle ({cycle}); data must flow forward")]
    return _stream_chain(g) + _coverage(arch, g) + _groups(g)


__all__ = ["COLORS", "LOOP_COLORS", "PARTS", "describe", "variant", "update_label", "loop_label",
           "loops_summary", "summary", "elr_parts", "loop_levels", "unrolled_graph",
           "folded_graph", "elide", "MAX_DRAWN", "to_dot", "to_mermaid", "graph_problems"]
