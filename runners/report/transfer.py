"""The report's "Does the ranking hold at larger scale?" section: an experiment's transfer
(``loopnas transfer``, ``EXP/transfer/transfer.json``) as quality against unique parameters,
one line per candidate with ±1 s.e. bars, the verdict and the table per scale."""
from __future__ import annotations

from html import escape
from pathlib import Path

import plotly.graph_objects as go

TITLE = "Does the ranking hold at larger scale?"


def figure(t) -> go.Figure:
    """Quality against unique parameters per candidate across the scales; the base front
    solid, its rivals dashed; an extrapolation as an open diamond with its interval."""
    from .charts import LAYOUT

    fig = go.Figure()
    base = t.scales[0]
    for i, c in enumerate(base.candidates):
        pts = [(r.candidates[i], r.label) for r in t.scales if r.candidates[i].mean is not None]
        if not pts:
            continue
        colour = f"hsl({(i * 137) % 360}, 65%, 45%)"
        fig.add_trace(go.Scatter(
            x=[p.unique_params for p, _ in pts], y=[p.mean for p, _ in pts], mode="lines+markers",
            name=c.label, legendgroup=c.label,
            line=dict(color=colour, dash="solid" if c.label in base.front else "dash"),
            error_y=dict(type="data", array=[p.se or 0 for p, _ in pts], visible=True, thickness=1.2, width=4),
            hovertext=[f"{c.label} at {label}: {p.mean:.4g} ± {p.se or 0:.2g}<br>{escape(p.summary or '')}"
                       for p, label in pts], hovertemplate="%{hovertext}<extra></extra>"))
        pred = next((p for p in t.extrapolation.candidates if p.label == c.label), None) if t.extrapolation else None
        if pred is not None:
            fig.add_trace(go.Scatter(
                x=[pts[-1][0].unique_params, pred.params], y=[pts[-1][0].mean, pred.predicted],
                mode="lines+markers", legendgroup=c.label, showlegend=False,
                line=dict(color=colour, dash="dot"), marker=dict(symbol=["circle", "diamond-open"], size=9),
                error_y=dict(type="data", symmetric=False, array=[0, pred.hi - pred.predicted],
                             arrayminus=[0, pred.predicted - pred.lo], visible=True),
                hovertext=["", f"EXTRAPOLATED {c.label}: {pred.predicted:.3g} ({pred.lo:.3g}–{pred.hi:.3g})"],
                hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(**LAYOUT)
    fig.update_layout(title_text=f"{t.metric} against unique parameters at each scale "
                                 f"(mean ± s.e., {t.seeds} seeds; dashed: not on the base front)")
    fig.update_xaxes(type="log", title="unique parameters" + (" (open diamonds: extrapolated)" if t.extrapolation else ""))
    fig.update_yaxes(title=t.metric)
    return fig


def section(exp_dir: Path | None) -> str:
    """The section's HTML, or "" when the experiment has no transfer. Called after the
    page's first chart, so plotly's JavaScript is already inlined."""
    from runners.transfer import find
    from runners.transfer.analysis import extrapolation_sentence
    from runners.transfer.output import SCALE_COLUMNS, scale_rows

    t = find(exp_dir) if exp_dir else None
    if t is None:
        return ""
    chart = figure(t).to_html(full_html=False, include_plotlyjs=False,
                              config={"displaylogo": False, "responsive": True})
    head = "".join(f"<th>{escape(c)}</th>" for c in SCALE_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in scale_rows(t))
    extra = ""
    if t.extrapolation is not None:
        extra = (f"<p class='note'><b>Extrapolated, not measured.</b> {escape(extrapolation_sentence(t.extrapolation))} "
                 f"{escape(t.extrapolation.note)}</p>")
    notes = "".join(f"<li>{escape(n)}</li>" for n in t.notes)
    return (f"<p class='noise'>{escape(t.verdict)}</p>{chart}"
            f"<p>{len(t.scales[0].candidates)} candidates ({escape(t.candidates_rule)}) × {t.seeds} seeds; "
            f"{escape(t.rules)}. A pair differs beyond seed noise when its test gives p &lt; {t.alpha:g} "
            f"(<code>transfer/transfer.md</code> lists every candidate and pair).</p>"
            f"<table><tr>{head}</tr>{body}</table>{extra}" + (f"<ul>{notes}</ul>" if notes else ""))


__all__ = ["TITLE", "figure", "section"]
