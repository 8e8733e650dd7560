"""Architecture diagrams: the folded graph drawn with matplotlib (no graphviz needed).

A vertical stack of boxes, embedding at the bottom and head at the top, one box per
sublayer coloured by op kind; each loop region is a bracket (or, around a single
sublayer, an arc) at the right, labelled ``×T`` and its update rule, nested regions
further out; ELR forms get prelude / recurrent / coda bands at the left.

``render(arch, path)`` picks the format from the suffix: ``.png``, ``.svg`` (drawn; past
:data:`nas.graph.MAX_DRAWN` layers, the middle ones as one box: :func:`nas.graph.elide`),
``.dot`` (Graphviz text), ``.mmd`` / ``.mermaid`` (Mermaid text), every sublayer.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import networkx as nx
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from nas.graph import COLORS, LOOP_COLORS, PARTS, elide, folded_graph, to_dot, to_mermaid
from nas.spec import ArchSpec

FORMATS = {".png": "png", ".svg": "svg", ".dot": "dot", ".mmd": "mermaid", ".mermaid": "mermaid"}

NAMES = {
    "attn": "attention (full)", "swa": "sliding-window attention", "dsa": "DeepSeek sparse attn",
    "nsa": "native sparse attn", "gdn": "Gated DeltaNet", "kda": "Kimi Delta Attention",
    "deltanet": "DeltaNet", "mamba2": "Mamba-2", "swiglu": "SwiGLU FFN", "moe": "MoE FFN",
    "none": "no FFN", "embedding": "embedding / head",
}
PART_FILL = {"prelude": "#f3efe4", "recurrent": "#fbe9f2", "coda": "#f3efe4"}

INCH = 0.3          # inches per data unit (equal aspect, so arcs stay round)
BOX_W, BOX_H, FFN_H = 7.0, 0.8, 0.6
IN_LAYER, BETWEEN = 0.85, 1.2   # pitch mixer→ffn, ffn→next mixer
FONT, SMALL = 8, 7


def _text_units(text: str, size: float) -> float:
    """Approximate printed length of ``text`` in data units."""
    return len(text) * size * 0.6 / 72 / INCH


def _layout(g: nx.DiGraph) -> dict[str, float]:
    """Centre height of each box, bottom to top."""
    ys, y, prev = {}, 0.0, None
    for n, d in g.nodes(data=True):
        if prev is not None:
            y += IN_LAYER if d["op"] == "ffn" else BETWEEN
        ys[n], prev = y, n
    return ys


def _height(d: dict) -> float:
    return FFN_H if d["op"] == "ffn" else BOX_H


def _box(ax, x0: float, y: float, d: dict) -> None:
    colors = [COLORS.get(b, "#ffffff") for b in d["branches"]] or [COLORS.get(d["variant"], "#ffffff")]
    w, h = BOX_W / len(colors), _height(d)
    hatch = "///" if d["kind"] == "switch" else None
    for k, c in enumerate(colors):
        ax.add_patch(Rectangle((x0 + k * w, y - h / 2), w, h, facecolor=c,
                               edgecolor="none", hatch=hatch, zorder=2))
    ax.add_patch(FancyBboxPatch((x0, y - h / 2), BOX_W, h, boxstyle="round,pad=0,rounding_size=0.15",
                                facecolor="none", edgecolor="#333333", linewidth=0.8, zorder=3))
    text = d["label"] + (f"   {d['schedule']}" if d["schedule"] else "")
    ax.text(x0 + BOX_W / 2, y, text, ha="center", va="center", zorder=4,
            fontsize=FONT if d["op"] != "ffn" else SMALL)


def _parts(ax, g: nx.DiGraph, ys: dict[str, float]) -> None:
    """ELR bands behind the boxes, named at the left."""
    for part in PARTS:
        members = [ys[n] for n, p in g.nodes(data="part") if p == part]
        if not members:
            continue
        lo, hi = min(members) - BOX_H / 2 - 0.25, max(members) + BOX_H / 2 + 0.25
        ax.add_patch(Rectangle((-2.2, lo), BOX_W + 2.5, hi - lo, facecolor=PART_FILL[part],
                               edgecolor="#bbbbbb", linewidth=0.6, linestyle="--", zorder=0))
        ax.text(-1.8, (lo + hi) / 2, part, rotation=90, ha="center", va="center",
                fontsize=FONT, style="italic", color="#555555")


def _brackets(g: nx.DiGraph, ys: dict[str, float]) -> list[dict]:
    """Geometry of each back-edge: arc or bracket, its ends, width and label placement.
    Brackets attach below / above the box centre line, clear of inner arcs and labels."""
    out = []
    for end, start, e in g.edges(data=True):
        if not e.get("back"):
            continue
        single, label = end == start, _text_units(e["label"], SMALL)
        y0 = ys[start] - (0 if single else 0.3 * _height(g.nodes[start]))
        y1 = ys[end] + (0 if single else 0.3 * _height(g.nodes[end]))
        rotated = not single and label < 0.95 * (y1 - y0)
        width = 1.3 + label if single else 0.7 if rotated else 0.5 + label
        out.append(dict(e, single=single, y0=y0, y1=y1, rotated=rotated, width=width))
    return out


def _loops(ax, g: nx.DiGraph, ys: dict[str, float]) -> float:
    """Arcs and brackets at the right, one column per nesting level; returns the rightmost x."""
    back = _brackets(g, ys)
    columns, x = {}, BOX_W + 0.35
    for level in sorted({b["level"] for b in back}):
        columns[level] = x
        x += max(b["width"] for b in back if b["level"] == level) + 0.3
    for b in back:
        color = LOOP_COLORS[(b["level"] - 1) % len(LOOP_COLORS)]
        xc, y0, y1 = columns[b["level"]], b["y0"], b["y1"]
        style = dict(fontsize=SMALL, color=color, fontweight="bold", va="center")
        if b["single"]:
            ax.add_patch(FancyArrowPatch((BOX_W, y0 + 0.2), (BOX_W, y0 - 0.2), arrowstyle="-|>",
                                         mutation_scale=9, connectionstyle="arc3,rad=-2.2",
                                         color=color, linewidth=1.3, zorder=5))
            ax.text(BOX_W + 1.25, y0, b["label"], ha="left", **style)
            continue
        ax.plot([BOX_W + 0.05, xc, xc], [y1, y1, y0], color=color, linewidth=1.4,
                solid_joinstyle="round", zorder=5)
        ax.add_patch(FancyArrowPatch((xc, y0), (BOX_W + 0.05, y0), arrowstyle="-|>", mutation_scale=10,
                                     color=color, linewidth=1.4, shrinkA=0, shrinkB=0, zorder=5))
        ax.text(xc + 0.3, (y0 + y1) / 2, b["label"], rotation=90 if b["rotated"] else 0,
                ha="center" if b["rotated"] else "left", **style)
    return x


def _legend(ax, g: nx.DiGraph) -> None:
    seen: list[str] = []
    for _, d in g.nodes(data=True):
        for v in d["branches"] or (d["variant"],):
            key = "embedding" if v == "head" else v
            if key not in seen:
                seen.append(key)
    handles = [Patch(facecolor=COLORS[v], edgecolor="#333333", label=NAMES.get(v, v)) for v in seen]
    levels = sorted({e["level"] for _, _, e in g.edges(data=True) if e.get("back")})
    handles += [Line2D([], [], color=LOOP_COLORS[(lv - 1) % len(LOOP_COLORS)], linewidth=1.6,
                       label="loop (×T, update rule)" if len(levels) == 1 else
                       f"loop, nesting level {lv}") for lv in levels]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=SMALL,
              frameon=False, borderaxespad=0.5)


def draw(g: nx.DiGraph) -> Figure:
    """The diagram of a folded graph (:func:`nas.graph.folded_graph`)."""
    ys = _layout(g)
    fig = Figure()
    ax = fig.add_axes((0, 0, 1, 1))
    order = list(g.nodes)
    ax.plot([BOX_W / 2] * 2, [ys[order[0]], ys[order[-1]]], color="#999999", linewidth=0.8, zorder=1)
    _parts(ax, g, ys)
    for n, d in g.nodes(data=True):
        _box(ax, 0.0, ys[n], d)
        if d["layer"] is not None and d["op"] == "mixer":
            ax.text(-0.25, ys[n] + IN_LAYER / 2, str(d["layer"]), ha="right", va="center",
                    fontsize=SMALL, color="#555555")
    right = _loops(ax, g, ys)
    left = -2.4 if any(p for _, p in g.nodes(data="part")) else -1.0
    top = max(ys.values()) + BOX_H / 2 + 0.4
    ax.set_xlim(left, right)
    ax.set_ylim(-BOX_H / 2 - 0.4, top)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.set_size_inches((right - left) * INCH, (top + BOX_H / 2 + 0.4) * INCH)
    summary = textwrap.fill(g.graph.get("summary", ""), width=max(60, int((right - left) * 2.2) + 25))
    ax.annotate(summary, (0, 1), xycoords="axes fraction", xytext=(0, 4), textcoords="offset points",
                fontsize=FONT, ha="left", va="bottom", color="#333333")
    ax.annotate(g.graph.get("name", ""), (0, 1), xycoords="axes fraction", ha="left", va="bottom",
                xytext=(0, 8 + 11 * (summary.count("\n") + 1)), textcoords="offset points",
                fontsize=12, fontweight="bold")
    _legend(ax, g)
    return fig


def render(arch: ArchSpec, path: str | Path) -> Path:
    """Write the diagram of a canonical spec; the suffix of ``path`` picks the format."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"unknown output format '{path.suffix}'; use one of {', '.join(FORMATS)}")
    g = folded_graph(arch)
    if fmt == "dot":
        path.write_text(to_dot(g), encoding="utf-8")
    elif fmt == "mermaid":
        path.write_text(to_mermaid(g), encoding="utf-8")
    else:
        draw(elide(g)).savefig(path, format=fmt, dpi=150, bbox_inches="tight", facecolor="white")
    return path


__all__ = ["FORMATS", "draw", "render"]
