"""`loopnas report` on fabricated experiment directories (no sweep is run)."""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nas.cost import cost
from nas.graph import summary
from nas.load import load_arch, loads_arch
from nas.pareto import knee_point, pareto_front
from runners.cli import main
from runners.report import front_2d, write_report
from runners.report.data import kendall_tau, load
from runners.results.records import ExperimentRecord, Objective, Point, Rung, TrialRecord, write_json

SEQ_LEN = 2048
OBJECTIVES = [Objective(name="acc", direction="maximize", measured=True),
              Objective(name="projection_flops", direction="minimize", measured=False)]
SPEC = """
name: {name}
model:
  vocab_size: 256
  width: {width}
  tie_embeddings: true
  defaults:
    gdn: {{num_heads: 2, head_dim: 32, expand_v: 1}}
    attn: {{num_heads: 4, output_gate: true}}
    swiglu: {{hidden_size: {ffn}}}
num_layers: {layers}
{layer}
{loop}
"""
GDN = "layer: {mixer: {kind: gdn}, ffn: {kind: swiglu}}"
LOOP = "loop: {{boundary: {boundary}, T: {T}, update: {{kind: residual_gate}}}}"
HYBRID = "hybrid: {ratio: {attn: 1, gdn: 1}, placement: bookend}"


# ---------------------------------------------------------------- fixture factory


def arch_of(width=64, layers=2, boundary="mixer", T=4, hybrid=False):
    name = f"{'hyb' if hybrid else 'gdn'}_w{width}_l{layers}_{boundary}{T}"
    return loads_arch(SPEC.format(name=name, width=width, ffn=2 * width, layers=layers,
                                  layer=HYBRID if hybrid else GDN, loop="" if boundary == "none" else
                                  LOOP.format(boundary=boundary, T=T)))


def acc_of(flops: float, jitter: float) -> float:
    """A saturating quality curve in compute, so the front is meaningful."""
    return round(0.95 - 0.6 * math.exp(-flops / 8e5) + jitter, 4)


def trial(number: int, status: str, arch=None, acc=None, points=None, **fields) -> TrialRecord:
    """A trial record as the sweep engine writes it; ``acc`` gives one point at the spec's
    own loops, ``points`` a list of (k, acc) for an elastic trial."""
    sheet = cost(arch, seq_len=SEQ_LEN).to_dict() if arch is not None else None
    if points is None and acc is not None:
        points = [(None, acc)]
    pts = [Point(k=k, values={"acc": a, "projection_flops": (
        sheet["per_k"][str(k)] if k is not None else sheet)["projection_flops_per_token"]})
        for k, a in points or []]
    final = pts[-1].values["acc"] if pts else 0.5
    rungs = [Rung(step=s, tokens=s * 512, quality=round(final * f + j, 4), metrics={"loss": 2 - f})
             for s, f, j in ((100, 0.6, 0.04 * math.sin(7 * number)), (200, 0.85, 0.01 * math.cos(3 * number)),
                             (400, 1.0, 0.0))] if pts else []
    return TrialRecord(
        id=f"t{number:04d}", number=number, status=status, arch=None if arch is None else arch.model_dump(mode="json"),
        summary=None if arch is None else summary(arch), cost=sheet, points=pts,
        rungs=fields.pop("rungs", rungs), started=1000.0 + number, **fields)


def standard_trials() -> list[TrialRecord]:
    """13 complete trials (one elastic with 4 points, one with a NaN point), and one each of
    running, failed, infeasible, pruned, duplicate."""
    grid = [(64, 2, "none", 1), (64, 2, "mixer", 2), (64, 2, "mixer", 4), (64, 2, "block", 4),
            (96, 2, "none", 1), (96, 2, "mixer", 4), (96, 3, "block", 2), (128, 2, "none", 1),
            (128, 2, "mixer", 4), (128, 3, "mixer", 2), (128, 4, "block", 4)]
    out = []
    for n, (w, l, b, t) in enumerate(grid):
        arch = arch_of(w, l, b, t)
        flops = cost(arch).projection_flops_per_token
        params = {"width": w, "num_layers": l, "boundary": b, "T": t, "lr": 1e-3 * (1 + n % 3)}
        out.append(trial(n, "complete", arch, acc_of(flops, 0.07 * math.sin(5 * n)),
                         params=params, finished=5000.0 - 100 * n, wall_time=60.0 + n))
    n = len(out)
    elr = load_arch("spaces/archs/tiny_elr.yaml")
    flops = [cost(elr).at(k).projection.total for k in (1, 2, 3, 4)]
    out.append(trial(n, "complete", elr, points=[(k, acc_of(f, 0.02)) for k, f in zip((1, 2, 3, 4), flops)],
                     params={"width": 64, "num_layers": 4, "boundary": "elr", "T": 4, "lr": 2e-3},
                     finished=4550.0))
    out.append(trial(n + 1, "complete", arch_of(64, 4, "block", 2, hybrid=True), acc=float("nan"),
                     params={"width": 64, "num_layers": 4, "boundary": "block", "T": 2, "lr": 1e-3},
                     finished=4560.0))
    out.append(trial(n + 2, "running", arch_of(96, 4, "mixer", 4), params={"width": 96}))
    out.append(trial(n + 3, "failed", arch_of(64, 3, "mixer", 2), reason="CUDA out of memory"))
    out.append(trial(n + 4, "infeasible", None, violations=["unique_params 3.1M > budget 2M"]))
    out.append(trial(n + 5, "pruned", arch_of(64, 2, "block", 2), rungs=[Rung(step=100, quality=0.2)]))
    out.append(trial(n + 6, "duplicate", arch_of(64, 2, "mixer", 4), duplicate_of="t0002"))
    return out


def make_experiment(root: Path, trials: list[TrialRecord], name="fabricated", total=None,
                    objectives=OBJECTIVES) -> Path:
    """An experiment directory as `runners/results/records.py` lays it out."""
    (root / "trials").mkdir(parents=True, exist_ok=True)
    write_json(root / "experiment.json", ExperimentRecord(
        name=name, space={"name": name}, objectives=objectives, engine="optuna",
        trials=total or len(trials), created=0.0, seq_len=SEQ_LEN))
    for t in trials:
        # json.dumps keeps NaN as the NaN token, as a diverged proxy would report it
        (root / "trials" / f"{t.id}.json").write_text(json.dumps(t.model_dump(mode="python"), indent=1))
    return root


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    return make_experiment(tmp_path_factory.mktemp("exp"), standard_trials(), total=24)


# ---------------------------------------------------------------- data


def test_points_of_complete_trials_only(experiment):
    exp = load(experiment)
    labels = [r.label for r in exp.rows]
    assert len(labels) == 15  # 11 plain trials, 4 loop counts of the elastic one
    assert [lbl for lbl in labels if lbl.startswith("t0011")] == [f"t0011 k={k}" for k in (1, 2, 3, 4)]
    assert {r.trial.status for r in exp.rows} == {"complete"}
    assert exp.excluded == ["t0012: acc = nan"]
    assert exp.counts == {"complete": 13, "running": 1, "failed": 1, "infeasible": 1,
                          "pruned": 1, "duplicate": 1}


def test_elastic_points_priced_at_their_k(experiment):
    exp = load(experiment)
    elastic = [r for r in exp.rows if r.k is not None]
    sheet = cost(load_arch("spaces/archs/tiny_elr.yaml"), seq_len=SEQ_LEN)
    assert [r.compute for r in elastic] == [sheet.at(k).projection.total for k in (1, 2, 3, 4)]
    assert [r.memory for r in elastic] == [
        sheet.at(k).kv_cache_bytes + sheet.at(k).state_bytes for k in (1, 2, 3, 4)]
    assert len({r.params for r in elastic}) == 1


def test_front_and_knee_from_raw_records(experiment):
    """The front, recomputed from the JSON files by brute force, is the report's."""
    raw = []
    for path in sorted((experiment / "trials").glob("t*.json")):
        t = json.loads(path.read_text())
        if t["status"] == "complete":
            raw += [(t["id"], p["k"], p["values"]["acc"], p["values"]["projection_flops"])
                    for p in t["points"] if not math.isnan(p["values"]["acc"])]
    on_front = {(i, k) for i, k, a, f in raw
                if not any(a2 >= a and f2 <= f and (a2 > a or f2 < f) for _, _, a2, f2 in raw)}
    exp = load(experiment)
    assert {(exp.rows[i].trial.id, exp.rows[i].k) for i in exp.front} == on_front
    assert 3 <= len(on_front) < len(raw)
    values = np.array([[a, f] for *_, a, f in raw])
    front = pareto_front(values, ["maximize", "minimize"])
    knee = raw[front[knee_point(values[front], ["maximize", "minimize"])]]
    assert (exp.rows[exp.knee].trial.id, exp.rows[exp.knee].k) == knee[:2]


def test_hypervolume_grows_in_completion_order(experiment):
    from runners.report.data import hypervolume_history
    history = hypervolume_history(load(experiment))
    assert len(history) == 12  # the NaN trial has no ranked point
    assert history[0][0] == "t0010"  # finished first
    hvs = [hv for _, hv in history]
    assert all(b >= a for a, b in zip(hvs, hvs[1:]))
    assert 0 < hvs[0] < hvs[-1] < 1


def test_rank_agreement(experiment):
    from runners.report.data import rank_agreement
    agreement = {a.step: a for a in rank_agreement(load(experiment))}
    assert sorted(agreement) == [100, 200, 400]
    assert agreement[400].tau == pytest.approx(1.0) and agreement[400].trials == 12
    assert agreement[100].tau < 1.0


def test_kendall_tau_by_hand():
    # 5 concordant pairs, 1 discordant
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # τ-b: a tie in x; (P - Q) / sqrt((P + Q + ties_x_only)(P + Q + ties_y_only)) = 2 / sqrt(2·3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([3, 2, 1], [1, 2, 3]) == pytest.approx(-1.0)
    assert math.isnan(kendall_tau([0.0, 0.0, 0.0], [1, 2, 3]))  # a rung where every trial ties


def test_parameter_importance(experiment):
    from runners.report.importance import param_importance
    importance, why = param_importance(load(experiment))
    assert why is None
    assert set(importance) == {"width", "num_layers", "boundary", "T", "lr"}
    assert sum(importance.values()) == pytest.approx(1.0)


def test_importance_imports_scikit_learn_without_pandas_and_gives_the_same_shares(experiment):
    """Issue #32: scikit-learn is imported with pandas absent (62 MB of the 10,000-candidate
    report's peak), the shares are those computed with pandas loaded first (the oracle: the
    forest fits arrays), and pandas imports as usual afterwards. Fresh processes: this one
    may have loaded either already."""
    import sys
    code = ("import json, sys\n"
            "if sys.argv[2] == 'pandas-first': import pandas\n"
            "from runners.report.data import load\n"
            "from runners.report.importance import param_importance\n"
            "shares, why = param_importance(load(sys.argv[1]))\n"
            "had = 'pandas' in sys.modules\n"
            "import pandas\n"
            "print(json.dumps([shares, why, had, pandas.DataFrame({'a': [1]}).shape[0]]))")
    runs = {how: json.loads(subprocess.run([sys.executable, "-c", code, str(experiment), how], check=True,
                                           capture_output=True, text=True, cwd=Path(__file__).parents[3]).stdout)
            for how in ("pandas-first", "as-the-report")}
    assert runs["as-the-report"][0] == runs["pandas-first"][0] and runs["as-the-report"][1] is None
    assert runs["as-the-report"][2:] == [False, 1]  # sklearn loaded without it; it imports after
    assert runs["pandas-first"][2:] == [True, 1]


def test_importance_keeps_the_trials_a_conditional_parameter_is_absent_from(tmp_path):
    """The quickstart's shape: T exists only for looped candidates. Quality is set by the
    mixer alone (0.3 vs 0.9, T and the loop add nothing), so the mixer must carry the
    importance; computed on the looped trials alone (optuna keeps only trials holding every
    parameter), a noise-sized T difference used to get most of it."""
    from runners.report.importance import param_importance
    trials, n = [], 0
    for mixer, base in (("gdn", 0.9), ("attn", 0.3)):
        for boundary, T in (("none", None), ("block", 2), ("block", 4), ("mixer", 2), ("mixer", 4)):
            params = {"mixer": mixer, "boundary": boundary} | ({} if T is None else {"T": T})
            acc = base + 0.004 * math.sin(3 * n) + (0.002 if T == 4 else 0.0)
            trials.append(trial(n, "complete", arch_of(64, 2, boundary, T or 1), acc, params=params,
                                finished=100.0 + n))
            n += 1
    importance, why = param_importance(load(make_experiment(tmp_path, trials)))
    assert why is None and set(importance) == {"mixer", "boundary", "T"}
    assert importance["mixer"] > 0.8 and importance["mixer"] == max(importance.values())


def test_importance_past_max_trials_is_computed_on_a_stated_sample(experiment, monkeypatch):
    """Issue #32: past MAX_TRIALS trials, fANOVA on a uniform sample (seed 0, completion
    order kept), and the chart's note says how many of how many."""
    import runners.report.importance as imp
    exp = load(experiment)
    n = len(imp.sampled(exp)[0])
    monkeypatch.setattr(imp, "MAX_TRIALS", n - 1)
    keep = imp.subsample(n)
    assert len(keep) == n - 1 and keep == sorted(set(keep)) and keep == imp.subsample(n)  # reproducible
    assert imp.sample_note(exp) == (f"importance from {n - 1:,} of {n:,} trials, sampled uniformly at random "
                                    "(without replacement, seed 0)")
    importance, why = imp.param_importance(exp)
    assert why is None and sum(importance.values()) == pytest.approx(1.0)
    from runners.report.charts import importance_figure
    assert imp.sample_note(exp) in importance_figure(importance, None, imp.sample_note(exp)).layout.title.text
    from runners.report.charts import parallel_figure
    lines = parallel_figure(exp)  # parallel coordinates: the same sample, said in the title
    assert len(lines.data[0].dimensions[0].values) == n - 1 and f"{n - 1:,} of {n:,} trials drawn" in \
        lines.layout.title.text
    monkeypatch.setattr(imp, "MAX_TRIALS", n)
    assert imp.subsample(n) is None and imp.sample_note(exp) == ""
    assert len(parallel_figure(exp).data[0].dimensions[0].values) == n


def test_front_png_past_many_draws_the_pages_decimation_without_bars(experiment, tmp_path, monkeypatch):
    """Issue #32: past MANY dominated points the PNG draws the page's decimation
    (charts.decimate) as one scatter, error bars on the front only."""
    import runners.report.static as static
    from runners.report.axes import axes

    exp = load(experiment)
    calls = []
    monkeypatch.setattr(static, "decimate", lambda *a, **kw: calls.append(a) or [0])
    static.front_png(exp, axes(exp)[0], tmp_path / "few.png")
    assert not calls  # few points: every one drawn with its bars, as before
    monkeypatch.setattr(static, "MANY", 1)
    labels = []
    from matplotlib.axes import Axes
    scatter = Axes.scatter
    monkeypatch.setattr(Axes, "scatter", lambda self, *a, **kw: labels.append(kw.get("label")) or scatter(self, *a, **kw))
    errorbar = Axes.errorbar
    bars = []
    monkeypatch.setattr(Axes, "errorbar", lambda self, *a, **kw: bars.append(kw["ecolor"]) or errorbar(self, *a, **kw))
    assert static.front_png(exp, axes(exp)[0], tmp_path / "many.png").stat().st_size > 10_000
    assert len(calls) == 1 and any(l and l.startswith("dominated (1 of ") for l in labels)
    assert bars in ([], [static.FRONT])  # bars on the front only (none where no point has seeds)


def test_plotly_is_inlined_once_gzipped(experiment, reported):
    """Issue #32: the page carries plotly.js once, gzipped into base64 (about 2 MB, not 4.8),
    unpacked offline by the browser (the page renders: test_page_renders_in_chromium), and
    diagrams with SVG text."""
    import base64
    import gzip

    from plotly.offline import get_plotlyjs

    html = (experiment / "report" / "index.html").read_text()
    assert html.count("DecompressionStream(\"gzip\")") == 1 and "* plotly.js v" not in html
    packed = re.search(r'var packed = "([A-Za-z0-9+/=]+)";', html).group(1)
    assert gzip.decompress(base64.b64decode(packed)).decode() == get_plotlyjs()
    assert len(html) < 2_600_000
    svg = base64.b64decode(re.search(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html).group(1)).decode()
    assert "<text" in svg and len(svg) < 20_000  # diagrams' text as SVG text, not glyph outlines


def test_seq_len_reprices_memory(experiment):
    exp, longer = load(experiment), load(experiment, seq_len=4 * SEQ_LEN)
    for a, b in zip(exp.rows, longer.rows):
        has_attention = any(layer["mixer"]["kind"] == "attn" for layer in a.trial.arch["layers"])
        assert (b.memory > a.memory) == has_attention
        assert b.compute == a.compute


def test_unreadable_record_is_named_not_fatal(tmp_path):
    root = make_experiment(tmp_path, standard_trials()[:5])
    bad = json.loads((root / "trials" / "t0001.json").read_text())
    bad["points"][0]["values"]["acc"] = None
    (root / "trials" / "t0001.json").write_text(json.dumps(bad))
    exp = load(root)
    assert len(exp.rows) == 4
    assert exp.excluded[0].startswith("t0001.json: unreadable record")


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def reported(experiment):
    """`loopnas report` once for the module: (exit code, stdout)."""
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["report", str(experiment)])
    return rc, out.getvalue()


def test_report_writes_page_pngs_and_csv(experiment, reported):
    rc, out = reported
    assert rc == 0
    report = experiment / "report"
    for name in ("front_compute", "front_params", "front_memory", "hypervolume"):
        png = (report / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000, name
    html = (report / "index.html").read_text()
    assert html.count('var packed = "') == 1  # the library inlined once (gzipped), for 7 charts
    assert html.count("Plotly.newPlot(") == 7
    assert not re.search(r"<script[^>]+src=", html)  # nothing fetched: opens offline
    assert html.count('src="data:image/svg+xml;base64,') == 7  # one diagram per front trial
    # hover: the architecture summary and the loop count
    unescaped = re.sub(r"\\u([0-9a-f]{4})", lambda m: chr(int(m.group(1), 16)), html)
    assert "<b>t0011 k=3</b><br>4 layers (3 gdn, 1 attn), width 64" in unescaped


def test_front_csv(experiment, reported):
    exp = load(experiment)
    with (experiment / "report" / "front.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(exp.front)
    flops = [float(r["projection_flops"]) for r in rows]
    assert flops == sorted(flops)
    assert sum(int(r["knee"]) for r in rows) == 1
    assert {(r["trial"], r["k"]) for r in rows if r["trial"] == "t0011"} <= {
        ("t0011", str(k)) for k in (1, 2, 3, 4)}


def test_terminal_table(experiment, reported):
    _, out = reported
    exp = load(experiment)
    assert "Pareto front" in out and "★" in out
    assert f"{len(exp.front)} of 15 points" in out
    assert "left out: t0012: acc = nan" in out
    assert out.rstrip().splitlines()[-1] == f"report: {experiment / 'report' / 'index.html'}"


def test_serving_objectives_are_columns_and_quality_stays_the_y_axis(tmp_path, capsys):
    objectives = [Objective(name="decode_latency_ms", direction="minimize", measured=True, serving=True),
                  *OBJECTIVES,
                  Objective(name="peak_memory_bytes", direction="minimize", measured=True, serving=True)]
    trials = []
    for n, (boundary, T) in enumerate((("none", 1), ("mixer", 4), ("block", 4))):
        t = trial(n, "complete", arch_of(64, 2, boundary, T), acc=0.5 + 0.1 * n, finished=10.0 + n)
        values = {**t.points[0].values, "decode_latency_ms": 2.0 + 3 * n, "peak_memory_bytes": 3e6 * (1 + n)}
        trials.append(t.model_copy(update={"points": [Point(values=values)]}))
    root = make_experiment(tmp_path / "serving", trials, objectives=objectives)
    exp = load(root)
    assert exp.quality.name == "acc" and len(exp.front) == 3  # each is best on something
    assert main(["report", str(root)]) == 0
    assert "Pareto front (3 of 3 points" in capsys.readouterr().out
    from rich.console import Console

    from runners.cli.report import front_table
    console = Console(width=250, record=True)
    console.print(front_table(exp))
    header, *rows = [l for l in console.export_text().splitlines() if "t000" in l or "decode" in l]
    assert "decode_latency_ms" in header and "peak_memory_bytes" in header
    assert "5 ms" in rows[1] and "5.722 MiB" in rows[1]  # each in its unit


def test_serving_objectives_get_their_own_charts_in_their_direction(tmp_path):
    """A throughput objective (maximised) is an x-axis where higher is better: its 2-D
    front keeps the fast, accurate points; the PNG and the interactive chart are written."""
    objectives = [*OBJECTIVES,
                  Objective(name="decode_tokens_per_s", direction="maximize", measured=True, serving=True)]
    trials = []
    # (acc, tokens/s): t0 slow and poor (dominated), t1 fast and poor, t2 slow and good
    for n, (acc, speed) in enumerate(((0.5, 100.0), (0.55, 900.0), (0.8, 300.0))):
        t = trial(n, "complete", arch_of(64, 2, "none", 1), acc=acc, finished=10.0 + n)
        values = {**t.points[0].values, "decode_tokens_per_s": speed}
        trials.append(t.model_copy(update={"points": [Point(values=values)]}))
    root = make_experiment(tmp_path / "serving", trials, objectives=objectives)
    exp = load(root)
    from runners.report.axes import serving_axes
    (axis,) = serving_axes(exp)
    assert axis.direction == "maximize" and axis.better == "higher is better"
    assert [exp.rows[i].trial.id for i in front_2d(exp, axis.attr, axis.direction)] == ["t0002", "t0001"]
    report = write_report(root)
    assert (root / "report" / f"{axis.png}.png") in report.pngs
    html = report.index.read_text()
    assert "Quality vs measured serving cost" in html and "higher is better" in html


def test_running_sweep_without_complete_trials(tmp_path, capsys):
    trials = [t for t in standard_trials() if t.status in ("running", "failed", "pruned")]
    root = make_experiment(tmp_path, trials, total=20)
    assert main(["report", str(root)]) == 0
    out = capsys.readouterr().out
    assert "no complete trials" in out
    html = (root / "report" / "index.html").read_text()
    assert "No complete trials with evaluated points yet (1 running)" in html
    assert "Plotly.newPlot(" not in html
    assert (root / "report" / "front.csv").read_text().count("\n") == 1  # the header


def test_one_complete_trial(tmp_path, capsys):
    root = make_experiment(tmp_path, standard_trials()[:1] + standard_trials()[-4:-3])
    assert main(["report", str(root)]) == 0
    html = (root / "report" / "index.html").read_text()
    assert html.count("Plotly.newPlot(") == 4  # 3 fronts and hypervolume; too few for the rest
    assert "needs 4 complete trials" in html


def test_not_an_experiment(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path} is not an experiment directory (no experiment.json)"]


# ---------------------------------------------------------------- in a browser

PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => __errors.push("error: " + e.message));
const __consoleError = console.error;
console.error = (...a) => { __errors.push("console.error: " + a.join(" ")); __consoleError(...a); };
window.addEventListener("load", () => setTimeout(() => {
  const pre = document.createElement("pre");
  pre.id = "probe-errors";
  pre.textContent = JSON.stringify(__errors);
  document.body.appendChild(pre);
}, 500));
</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000",
         *args], capture_output=True, text=True, timeout=180)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed "
                    "(Debian: apt-get install -y chromium; .ci/run installs it)")
def test_page_renders_in_chromium(experiment, reported, tmp_path):
    """Open index.html from a file: every chart drawn, no JavaScript errors. The page is
    probed through a copy with an error-recording script in <head>."""
    html = (experiment / "report" / "index.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("<head>", "<head>" + PROBE, 1))
    run = chromium("--dump-dom", probe.as_uri())
    dom = run.stdout
    found = re.search(r'<pre id="probe-errors">(.*?)</pre>', dom)
    assert found, f"the page did not finish loading:\n{run.stderr[-2000:]}"
    assert json.loads(found.group(1).replace("&quot;", '"')) == []
    assert not [l for l in run.stderr.splitlines() if "CONSOLE" in l and "Uncaught" in l]
    assert dom.count('class="plot-container plotly"') == 7
    assert dom.count('class="main-svg"') >= 14  # each cartesian chart draws two layers
    assert dom.count('class="scatterlayer') >= 4
    if os.environ.get("LOOPNAS_REPORT_SHOTS"):  # a picture to look at: 12 s more
        shots = Path(os.environ["LOOPNAS_REPORT_SHOTS"])
        shots.mkdir(parents=True, exist_ok=True)
        chromium("--window-size=1300,5200", f"--screenshot={shots / 'report.png'}",
                 (experiment / "report" / "index.html").as_uri())
        assert (shots / "report.png").stat().st_size > 50_000


def test_a_serving_objective_with_a_batch_keeps_its_unit():
    """``cache_bytes/b4`` (a batch, no seq_len) is a bytes axis: the metric is cut at ``/`` as
    well as ``@`` (it used to be cut at ``@`` only, so it lost its unit)."""
    from types import SimpleNamespace

    from runners.report.axes import serving_axes
    from runners.results.records import Objective

    objectives = [Objective(name=n, direction="minimize", measured=True, serving=True)
                  for n in ("cache_bytes/b4", "cache_bytes@4096/b4", "peak_memory_bytes@512")]
    assert [o.metric for o in objectives] == ["cache_bytes", "cache_bytes", "peak_memory_bytes"]
    axes = serving_axes(SimpleNamespace(objectives=objectives))
    assert [a.unit for a in axes] == ["B", "B", "B"]
