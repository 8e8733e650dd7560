"""The interactive plotly charts of the report page."""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import plotly.graph_objects as go

from .axes import Axis, hover, log_scale, quality_title
from .data import Agreement, Experiment, front_2d
from .importance import sampled, subsample, varying

FRONT, DOMINATED, KNEE, ELASTIC = "#d62728", "#9aa7b8", "#ffbf00", "#c7c7c7"
MANY = 2000  # dominated points drawn one by one up to this many; past it, one WebGL trace, decimated
GRID = (240, 120)  # past MANY: one dominated point kept per cell of this grid over the plot
LAYOUT = dict(template="plotly_white", height=480, margin=dict(l=70, r=30, t=90, b=60),
              title=dict(y=0.97, yanchor="top"),
              legend=dict(orientation="h", yanchor="bottom", y=1.01, xanchor="right", x=1.0))


def _scatter(exp: Experiment, axis: Axis, idx: list[int], bars: bool = True, **style) -> go.Scatter:
    """Points of ``idx``; ``bars``: ±1 standard error of the quality over seed replicates."""
    rows = [exp.rows[i] for i in idx]
    errors = [r.error(exp.quality.name) for r in rows]
    if bars and any(errors):
        style["error_y"] = dict(type="data", array=errors, visible=True, thickness=1.2, width=4,
                                color=style.get("marker", {}).get("color", DOMINATED))
    return go.Scatter(x=[axis.value(r) for r in rows],
                      y=[r.values[exp.quality.name] for r in rows],
                      hovertext=[hover(exp, r) for r in rows],
                      hovertemplate="%{hovertext}<extra></extra>", **style)


def _elastic_links(exp: Experiment, axis: Axis) -> list[go.Scatter]:
    """A dotted line through each elastic trial's points, k = 1..K."""
    by_trial = defaultdict(list)
    for i, r in enumerate(exp.rows):
        if r.k is not None:
            by_trial[r.trial.id].append(i)
    traces = []
    for n, idx in enumerate(v for v in by_trial.values() if len(v) > 1):
        idx = sorted(idx, key=lambda i: exp.rows[i].k)
        traces.append(_scatter(exp, axis, idx, bars=False, mode="lines", hoverinfo="skip",
                               line=dict(color=ELASTIC, dash="dot", width=1.5),
                               name="one elastic trial, k = 1…K", legendgroup="elastic",
                               showlegend=n == 0))
    return traces


def decimate(xs: list[float], ys: list[float], log_x: bool, cells: tuple[int, int] = GRID) -> list[int]:
    """Positions of the points to draw: one per cell of a ``cells`` grid over the plot (x on
    a log scale when ``log_x``), the first in each, in their order. At a chart's size a cell
    is a few pixels, so what is drawn looks the same and hovers on a point of each cell."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if log_x:
        x = np.log(x)
    cell = [np.floor((v - v.min()) / ((v.max() - v.min()) or 1.0) * (n - 1e-9)).astype(int)
            for v, n in zip((x, y), cells)]
    _, first = np.unique(cell[0] * cells[1] + cell[1], return_index=True)
    return sorted(first.tolist())


def _dominated(exp: Experiment, axis: Axis, rest: list[int], xs: list[float]) -> go.Scatter | go.Scattergl:
    """The dominated points: as they are up to :data:`MANY`; past it, decimated to one per
    grid cell and drawn by WebGL, without error bars, with a short hover text."""
    style = dict(mode="markers", marker=dict(color=DOMINATED, size=8, opacity=0.75))
    if len(rest) <= MANY:
        return _scatter(exp, axis, rest, name="dominated", **style)
    q = exp.quality.name
    keep = [rest[j] for j in decimate([xs[i] for i in rest], [exp.rows[i].values[q] for i in rest], log_scale(xs))]
    rows = [exp.rows[i] for i in keep]
    return go.Scattergl(x=[axis.value(r) for r in rows], y=[r.values[q] for r in rows],
                        hovertext=[f"{r.label}: {q} = {r.values[q]:.4g}, {axis.short} {axis.fmt(axis.value(r))}"
                                   for r in rows], hovertemplate="%{hovertext}<extra></extra>",
                        name=f"dominated ({len(keep):,} of {len(rest):,} drawn: one per cell)",
                        **{**style, "marker": dict(color=DOMINATED, size=6, opacity=0.6)})


def front_figure(exp: Experiment, axis: Axis) -> go.Figure:
    """Quality against one cost: every point (the dominated ones decimated past
    :data:`MANY`), the front in this plane as a red line, the knee of the experiment's
    front as a star."""
    front = front_2d(exp, axis.attr, axis.direction)
    on = set(front)
    rest = [i for i in range(len(exp.rows)) if i not in on]
    xs = [axis.value(r) for r in exp.rows]
    fig = go.Figure(_elastic_links(exp, axis))
    fig.add_trace(_dominated(exp, axis, rest, xs))
    fig.add_trace(_scatter(exp, axis, front, mode="lines+markers", name="Pareto front",
                           line=dict(color=FRONT, width=2.5),
                           marker=dict(color=FRONT, size=12, line=dict(color="black", width=1))))
    if exp.knee is not None:
        fig.add_trace(_scatter(exp, axis, [exp.knee], bars=False, mode="markers", name="knee",
                               marker=dict(symbol="star", color=KNEE, size=20,
                                           line=dict(color="black", width=1))))
    fig.update_layout(**LAYOUT)
    bars = " (±1 s.e. over seeds)" if any(r.se for r in exp.rows) else ""
    fig.update_layout(title_text=f"{exp.quality.name} vs {axis.short}{bars}")
    fig.update_xaxes(title=f"{axis.title} ({axis.better})", **_ticks(axis, xs))
    fig.update_yaxes(title=quality_title(exp))
    return fig


def _ticks(axis: Axis, xs: list[float]) -> dict:
    """SI tick labels (200k, 1M); bytes at powers of two (16 KiB, 256 KiB)."""
    if not log_scale(xs):
        return dict(type="linear", tickformat="~s")
    if axis.unit != "B":
        return dict(type="log", tickformat="~s")
    lo, hi = math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs)))
    step = max(1, (hi - lo) // 6)
    ticks = [2.0**e for e in range(lo, hi + 1, step)]
    return dict(type="log", tickvals=ticks, ticktext=[axis.fmt(t) for t in ticks])


def hypervolume_figure(history: list[tuple[str, float]]) -> go.Figure:
    """The hypervolume after each completed trial: a step drawn at each change only (the
    last trial too), so 10,000 trials with 40 changes are 41 points."""
    keep = [i for i in range(len(history)) if i in (0, len(history) - 1) or history[i][1] != history[i - 1][1]]
    history_x = [i + 1 for i in keep]
    history = [history[i] for i in keep]
    fig = go.Figure(go.Scatter(
        x=history_x, y=[hv for _, hv in history], mode="lines+markers",
        line=dict(shape="hv", color=FRONT), customdata=[t for t, _ in history],
        hovertemplate="after %{customdata} (trial %{x} to finish)<br>hypervolume %{y:.4f}<extra></extra>"))
    fig.update_layout(**LAYOUT)
    fig.update_layout(title_text="hypervolume as trials complete")
    fig.update_xaxes(title="complete trials, in order of completion", rangemode="tozero",
                     dtick=max(1, math.ceil((history_x[-1] if history_x else 0) / 10)))
    fig.update_yaxes(title="share of the objective box dominated", rangemode="tozero")
    return fig


def agreement_figure(agreement: list[Agreement]) -> go.Figure:
    """τ per rung; a rung at which every trial ties has no τ and shows as a grey stub."""
    defined = [not math.isnan(a.tau) for a in agreement]
    fig = go.Figure(go.Bar(
        x=[f"step {a.step}" for a in agreement], y=[a.tau if d else 0.02 for a, d in zip(agreement, defined)],
        text=[f"τ={a.tau:.2f}<br>n={a.trials}" if d else f"all tied<br>n={a.trials}"
              for a, d in zip(agreement, defined)], textposition="outside",
        marker_color=[FRONT if d and a.tau >= 0.6 else DOMINATED for a, d in zip(agreement, defined)],
        hovertemplate="%{x}: %{text}<extra></extra>"))
    fig.update_layout(**LAYOUT)
    fig.update_layout(title_text="rank agreement of rungs with the final quality")
    fig.update_yaxes(title="Kendall τ", range=[-1.05, 1.35], tickvals=[-1, -0.5, 0, 0.5, 1])
    return fig


def importance_figure(importance: dict[str, float], floor: float | None = None, note: str = "") -> go.Figure:
    """fANOVA importance on replicate means; ``floor``: the share of the means' variance that
    seed noise alone would give (a parameter below it is indistinguishable from noise);
    ``note``: a line under the title (``importance.sample_note``: computed on a sample)."""
    names = sorted(importance, key=importance.get)
    colors = [FRONT if floor is None or importance[n] > floor else DOMINATED for n in names]
    fig = go.Figure(go.Bar(x=[importance[n] for n in names], y=names, orientation="h",
                           marker_color=colors, hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_layout(**{**LAYOUT, "height": 200 + 30 * len(names)})
    title = "parameter importance for the final quality (fANOVA on seed means)"
    if floor is not None:
        fig.add_vline(x=min(floor, 1.0), line_dash="dash", line_color="black",
                      annotation_text=f"seed-noise floor {floor:.2f}", annotation_position="top right")
    else:
        title += "; seed noise unknown (one seed)"
    if note:
        title += f"<br><sup>{note}</sup>"
    fig.update_layout(title_text=title)
    fig.update_xaxes(title="share of quality variance", range=[0, 1])
    return fig


def _dimension(name: str, values: list) -> dict:
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return dict(label=name, values=values)
    levels = sorted({str(v) for v in values})
    return dict(label=name, values=[levels.index(str(v)) for v in values],
                tickvals=list(range(len(levels))), ticktext=levels)


def parallel_figure(exp: Experiment) -> go.Figure | None:
    """Parallel coordinates: each complete trial a line through its sampled parameters,
    ending at its final quality and coloured by it; past ``importance.MAX_TRIALS`` trials,
    the lines of importance's sample (``importance.subsample``), as the title says."""
    params, quality = sampled(exp)
    keep, total = subsample(len(params)), len(params)
    if keep is not None:
        params, quality = [params[i] for i in keep], [quality[i] for i in keep]
    names = [n for n in varying(params) if all(n in p for p in params)]
    if len(params) < 2 or not names:
        return None
    dims = [_dimension(n, [p[n] for p in params]) for n in names]
    dims.append(dict(label=exp.quality.name, values=quality))
    fig = go.Figure(go.Parcoords(dimensions=dims, line=dict(
        color=quality, colorscale="Viridis", reversescale=exp.quality.direction == "minimize",
        showscale=True, colorbar=dict(title=exp.quality.name))))
    fig.update_layout(**{**LAYOUT, "margin": dict(l=70, r=30, t=120, b=40)})
    title = "sampled parameters of the complete trials, coloured by final quality"
    if keep is not None:
        title += (f"<br><sup>{len(keep):,} of {total:,} trials drawn, sampled uniformly at random "
                  "(without replacement, seed 0)</sup>")
    fig.update_layout(title_text=title)
    return fig


__all__ = ["MANY", "agreement_figure", "decimate", "front_figure", "hypervolume_figure", "importance_figure",
           "parallel_figure"]
