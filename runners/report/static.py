"""PNGs of the main charts with matplotlib, for papers and terminals."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from runners.checkpoint import save_figure

from .axes import Axis, log_scale, quality_title
from .charts import DOMINATED, ELASTIC, FRONT, KNEE, MANY, decimate
from .data import Experiment, front_2d


def _xy(exp: Experiment, axis: Axis, idx: list[int]) -> tuple[list[float], list[float]]:
    return ([axis.value(exp.rows[i]) for i in idx],
            [exp.rows[i].values[exp.quality.name] for i in idx])


def front_png(exp: Experiment, axis: Axis, path: Path) -> Path:
    """Quality against one cost, the front in this plane in red, members labelled. Past
    :data:`~.charts.MANY` dominated points, the page's decimation (:func:`~.charts.decimate`:
    one per cell of a 240×120 grid) drawn as one scatter without error bars: 10,000 bars
    take matplotlib seconds and at 150 dpi overlap into a band."""
    front = front_2d(exp, axis.attr, axis.direction)
    on = set(front)
    rest = [i for i in range(len(exp.rows)) if i not in on]
    xs = [axis.value(r) for r in exp.rows]
    many = len(rest) > MANY  # past MANY, as on the page: one dominated point per grid cell, no bars
    if many:
        drawn = decimate([xs[i] for i in rest], [exp.rows[i].values[exp.quality.name] for i in rest], log_scale(xs))
        shown = [rest[j] for j in drawn]
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    elastic = defaultdict(list)
    for i, r in enumerate(exp.rows):
        if r.k is not None:
            elastic[r.trial.id].append(i)
    for n, idx in enumerate(v for v in elastic.values() if len(v) > 1):
        ax.plot(*_xy(exp, axis, sorted(idx, key=lambda i: exp.rows[i].k)), ":", color=ELASTIC,
                linewidth=1.2, zorder=1, label="one elastic trial, k = 1…K" if n == 0 else None)
    if many:
        ax.scatter(*_xy(exp, axis, shown), s=10, color=DOMINATED, alpha=0.6, linewidths=0, zorder=2,
                   label=f"dominated ({len(shown):,} of {len(rest):,} drawn: one per cell, no bars)")
    else:
        ax.scatter(*_xy(exp, axis, rest), s=28, color=DOMINATED, alpha=0.8, zorder=2, label="dominated")
    ax.plot(*_xy(exp, axis, front), "-o", color=FRONT, markersize=7, markeredgecolor="black",
            markeredgewidth=0.7, linewidth=2, zorder=3, label="Pareto front")
    if any(r.se for r in exp.rows):  # ±1 standard error over seed replicates
        for idx, color in ((front, FRONT),) if many else ((rest, DOMINATED), (front, FRONT)):
            ax.errorbar(*_xy(exp, axis, idx), yerr=[exp.rows[i].error(exp.quality.name) for i in idx],
                        fmt="none", ecolor=color, elinewidth=1, capsize=3, zorder=2)
    if exp.knee is not None:
        ax.scatter(*_xy(exp, axis, [exp.knee]), marker="*", s=260, color=KNEE, edgecolor="black",
                   linewidth=0.7, zorder=4, label="knee")
    for x, y, i in zip(*_xy(exp, axis, front), front):
        ax.annotate(exp.rows[i].label, (x, y), xytext=(5, -11), textcoords="offset points",
                    fontsize=7, color="#7a1010")
    if log_scale(xs):
        ax.set_xscale("log", base=2 if axis.unit == "B" else 10)
        if axis.unit != "B":  # label 2× and 5× between the decades too
            ax.xaxis.set_minor_locator(LogLocator(subs=(2, 5)))
            ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: axis.fmt(x)))
            ax.tick_params(axis="x", which="both", labelsize=8)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: axis.fmt(x)))
    ax.set_xlabel(f"{axis.title} ({axis.better})", fontsize=9)
    ax.set_ylabel(quality_title(exp))
    bars = " (±1 s.e. over seeds)" if any(r.se for r in exp.rows) else ""
    ax.set_title(f"{exp.record.name}: {exp.quality.name} vs {axis.short}{bars}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return save_figure(fig, path, dpi=150, facecolor="white")  # atomic: never through a symlink


def hypervolume_png(history: list[tuple[str, float]], name: str, path: Path) -> Path:
    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.add_subplot()
    ax.step(range(1, len(history) + 1), [hv for _, hv in history], "-o", where="post",
            color=FRONT, markersize=4)
    ax.set_xlabel("complete trials, in order of completion")
    ax.set_ylabel("share of objective box dominated")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{name}: hypervolume as trials complete", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, dpi=150, facecolor="white")  # atomic: never through a symlink


__all__ = ["front_png", "hypervolume_png"]
