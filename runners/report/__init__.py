"""``loopnas report``: the Pareto front of an experiment directory as a self-contained HTML
page with interactive charts, PNGs of the main charts and ``front.csv``.

Reads the records only (no torch), so it runs on a sweep that is still going: trials not yet
complete are counted, not plotted.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from runners.checkpoint import atomic, own_dir
from runners.nogc import frozen_gc, paused_gc
from runners.results.records import write_text

from .axes import axes, serving_axes
from .data import Experiment, front_2d, hypervolume_history, load, rank_agreement
from .oneshot import check_section
from .page import diagram_uri, document, front_table, header, plotly_script, plural
from .transfer import TITLE as TRANSFER_TITLE
from .transfer import section as transfer_section

REPORT = "report"


@dataclass(frozen=True)
class Report:
    experiment: Experiment
    index: Path
    csv: Path
    pngs: tuple[Path, ...]


def write_csv(exp: Experiment, path: Path) -> Path:
    """The experiment's front, one row per point, cheapest projection compute first."""
    names = [o.name for o in exp.objectives]
    measured = [o.name for o in exp.objectives if o.measured]
    fields = ["trial", "k", "knee", *names, *(f"{n}_se" for n in measured), "seeds", "p_front",
              "within_noise", "unique_params", "projection_flops_per_token",
              "kv_cache_bytes", "state_bytes", "summary", "params"]
    with atomic(path) as tmp, tmp.open("w", newline="") as f:  # never through a symlink at path
        writer = csv.writer(f)
        writer.writerow(fields)
        for i in sorted(exp.front, key=lambda i: (exp.rows[i].compute, exp.rows[i].label)):
            r = exp.rows[i]
            writer.writerow([r.trial.id, "" if r.k is None else r.k, int(i == exp.knee),
                             *(r.values[n] for n in names), *(r.se.get(n, "") for n in measured), r.n,
                             "" if r.p_front is None else r.p_front, "" if r.tied is None else int(r.tied),
                             int(r.params), int(r.compute),
                             r.sheet["kv_cache_bytes"], r.sheet["state_bytes"], r.summary,
                             json.dumps(r.trial.params, sort_keys=True)])
    return path


def _section(title: str, blocks: list[str], grid: bool = False) -> str:
    inner = "".join(f"<div>{b}</div>" for b in blocks)
    return f"<h2>{title}</h2>" + (f"<div class='grid'>{inner}</div>" if grid else inner)


def _charts(exp: Experiment, out: Path) -> tuple[list[str], list[Path]]:
    """The page body below the header, in parts (plotly.js first: 2 MB gzipped,
    ``page.plotly_script``; then each section, never joined: the page is written part by
    part, 15 MB of copies less at 10,000 candidates), and the PNGs written."""
    from .charts import (
        agreement_figure, front_figure, hypervolume_figure, importance_figure, parallel_figure,
    )
    from .importance import noise_floor, param_importance, sample_note
    from .static import front_png, hypervolume_png

    def html(fig) -> str:
        """A figure's <div> (plotly.js precedes every chart: the body's first part)."""
        return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})

    def missing(text: str) -> str:
        return f"<p class='empty'>{text}</p>"

    compute, params, memory = axes(exp)
    pngs = [front_png(exp, a, out / f"{a.png}.png") for a in (compute, params, memory)]
    body = [plotly_script(), _section("Quality vs projection compute", [html(front_figure(exp, compute))])]
    body.append(_section("Quality vs parameters and memory",
                         [html(front_figure(exp, params)), html(front_figure(exp, memory))], grid=True))
    serving = serving_axes(exp)
    if serving:
        pngs += [front_png(exp, a, out / f"{a.png}.png") for a in serving]
        body.append(_section("Quality vs measured serving cost",
                             [html(front_figure(exp, a)) for a in serving], grid=len(serving) > 1))
    history = hypervolume_history(exp)
    pngs.append(hypervolume_png(history, exp.record.name, out / "hypervolume.png"))
    agreement = rank_agreement(exp)
    body.append(_section("Search progress and proxy trustworthiness", [
        html(hypervolume_figure(history)),
        html(agreement_figure(agreement)) if agreement else missing(
            "Rank agreement needs 3 complete trials evaluated at the same rung step.")], grid=True))
    importance, why = param_importance(exp)
    parallel = parallel_figure(exp)
    body.append(_section("Sampled parameters", [
        html(importance_figure(importance, noise_floor(exp), sample_note(exp))) if importance
        else missing(f"Parameter importance: {why}."),
        html(parallel) if parallel else missing("Parallel coordinates need 2 complete trials "
                                                "with a varying sampled parameter.")]))
    calibration = _calibration(exp)
    if calibration:
        body.append(_section("Calibration: can the proxy see each axis?", [calibration]))
    check = check_section(exp.dir)  # a one-shot sweep's self-check
    if check:
        body.append(_section("One-shot self-check: does the supernet rank like stand-alone training?", [check]))
    transfer = transfer_section(exp.dir)  # loopnas transfer: EXP/transfer/
    if transfer:
        body.append(_section(TRANSFER_TITLE, [transfer]))
    diagrams: dict[str, str | None] = {}
    for trial in (exp.rows[i].trial for i in exp.front):  # one per trial: an elastic one has a row per k
        if trial.arch is not None and trial.id not in diagrams:
            diagrams[trial.id] = diagram_uri(trial.arch)
    body.append(_section(f"The front: {plural(len(exp.front), 'point')} over "
                         f"{', '.join(o.name for o in exp.objectives)}", [front_table(exp, diagrams)]))
    return body, pngs


def _calibration(exp: Experiment) -> str:
    """The space's calibration (``loopnas calibrate``) as a table, when one exists: in
    ``EXP/calibration/`` or the space's default calibration directory."""
    from html import escape

    from runners.calibrate import CALIBRATION, COLUMNS, RULE, find, table

    space = exp.record.space
    cal = (find(exp.dir, space) if exp.dir else None) or find(Path("runs") / exp.record.name, space)
    if cal is None:
        return ""
    budget = cal.budgets[-1]
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
                   for cells in table(budget.axes, strong=lambda s: f"<b>{s}</b>", escape=escape))
    verdicts = "".join(f"<li><code>{escape(a.param)}</code>: {escape(a.verdict)}</li>" for a in budget.axes)
    return (f"<p>{cal.candidates} candidates × {cal.seeds} seeds at {budget.steps} steps on "
            f"{escape(cal.metric)} (<code>{CALIBRATION}/calibration.md</code>; {escape(RULE)}; "
            f"Holm over {cal.looks} tests):</p><table><tr>{head}</tr>{body}</table>"
            f"<ul>{verdicts}</ul>")


def _empty(exp: Experiment) -> str:
    pending = exp.counts.get("running", 0)
    return (f"<p class='empty'>No complete trials with evaluated points yet"
            f"{f' ({pending} running)' if pending else ''}: the charts appear once the first "
            f"trial completes. Run <code>loopnas report</code> again to refresh.</p>")


def write_report(exp_dir: str | Path, seq_len: int | None = None) -> Report:
    """Write ``EXP/report/``: ``index.html``, the PNGs and ``front.csv``."""
    with paused_gc():  # 10,000 records' digests: the cyclic collector's passes cost 3 s (runners.nogc)
        exp = load(exp_dir, seq_len)
    with frozen_gc():  # the figures' cycles freed as they go, the records not walked (runners.nogc)
        out = own_dir(Path(exp_dir) / REPORT)  # a symlinked report/ is replaced, not written through
        body, pngs = _charts(exp, out) if exp.rows else ([_empty(exp)], [])
        index = out / "index.html"
        write_text(index, document(f"{exp.record.name}: loopnas report", [header(exp), *body]))  # atomic
        return Report(exp, index, write_csv(exp, out / "front.csv"), tuple(pngs))


__all__ = ["REPORT", "Report", "front_2d", "load", "write_csv", "write_report"]
