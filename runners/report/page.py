"""The self-contained HTML page: plotly's JavaScript inlined once (gzipped: :func:`plotly_script`),
diagrams as data URIs."""
from __future__ import annotations

import base64
import functools
import io
import json
import time
from html import escape

from nas.units import nbytes, si

from runners.results.table import value_text

from .data import Experiment, Row

CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1200px; padding: 0 16px; color: #222; }
h1 { margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 1px solid #ddd; }
.meta { color: #555; } .noise { font-size: 1.1em; background: #eef4ff; padding: 8px 12px; border-left: 4px solid #1f77b4; } .note { background: #fff8e1; padding: 8px 12px; border-left: 4px solid #ffbf00; }
.empty { font-size: 1.2em; background: #f5f5f5; padding: 24px; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 6px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.knee { background: #fff8e1; } .diagram { max-width: 400px; max-height: 440px; }
dl { margin: 0; display: grid; grid-template-columns: auto auto; gap: 0 10px; }
dt { color: #666; white-space: nowrap; } dd { margin: 0; text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
"""


_PLOTLY_LOADER = """<script>window.PlotlyConfig = {MathJaxConfig: 'local'};
(function () {
  // plotly.js, gzipped and base64-encoded (2 MB instead of 4.8): unpacked by the browser's
  // DecompressionStream, no network. Charts asked for before it is ready wait in a queue.
  var queue = [];
  window.Plotly = {newPlot: function () { queue.push(arguments); }};
  function fail(why) {
    var p = document.createElement("p");
    p.className = "empty";
    p.textContent = "The interactive charts cannot be drawn: " + why + ". The PNGs beside this page show them.";
    document.body.insertBefore(p, document.body.firstChild);
  }
  if (!("DecompressionStream" in window)) { fail("this browser has no DecompressionStream (2020 and later ones do)"); return; }
  var packed = "%s";
  var bytes = Uint8Array.from(atob(packed), function (c) { return c.charCodeAt(0); });
  new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text().then(function (code) {
    delete window.Plotly;
    var script = document.createElement("script");
    script.textContent = code;
    document.head.appendChild(script);
    queue.forEach(function (args) { window.Plotly.newPlot.apply(window.Plotly, args); });
  }).catch(function (e) { fail(String(e)); });
})();
</script>"""


@functools.lru_cache(maxsize=1)
def plotly_script() -> str:
    """One ``<script>``, before the first chart: plotly.js (the installed plotly package's
    bundle) gzipped into base64 and unpacked in the browser (DecompressionStream; offline).
    Until it is, ``Plotly.newPlot`` of each chart's own script queues its arguments."""
    import gzip

    from plotly.offline import get_plotlyjs

    packed = base64.b64encode(gzip.compress(get_plotlyjs().encode(), 6, mtime=0)).decode()
    return _PLOTLY_LOADER % packed


def diagram_uri(arch: dict) -> str | None:
    """The folded architecture diagram (``loopnas graph``) as an SVG data URI. An <img>
    keeps each SVG's element ids apart from the page's and the other diagrams'. Drawn once
    per distinct spec (front members often share one); its text is SVG text in the viewer's
    DejaVu Sans (else its sans-serif), not outlines: 10 KB a diagram instead of 42 (issue #32)."""
    return _diagram(json.dumps(arch, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _diagram(arch_json: str) -> str | None:
    arch = json.loads(arch_json)
    from matplotlib import rc_context

    from nas.graph import folded_graph
    from nas.spec import stored_spec
    from runners.render import draw

    buf = io.BytesIO()
    with rc_context({"svg.fonttype": "none"}):  # text as <text>, not glyph outlines: 4.5x smaller
        draw(folded_graph(stored_spec(arch))).savefig(
            buf, format="svg", bbox_inches="tight", facecolor="white")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode()


def _dl(items: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items) + "</dl>"


def cost_items(row: Row) -> list[tuple[str, str]]:
    s = row.sheet
    items = [("unique params", si(row.params)), ("proj FLOPs/tok", si(row.compute)),
             ("fwd FLOPs/tok", si(s["forward_flops_per_token"])),
             ("KV cache/seq", nbytes(s["kv_cache_bytes"])), ("state/seq", nbytes(s["state_bytes"]))]
    if s.get("train_flops_per_token") is not None:
        items.append(("train FLOPs/tok", si(s["train_flops_per_token"])))
    return items


def metric_items(exp: Experiment, row: Row) -> list[tuple[str, str]]:
    items = [(o.name, value_text(o, row.values[o.name]) + (f" ± {row.se[o.name]:.2g}" if row.se.get(o.name) else ""))
             for o in exp.objectives]
    items.append(("seeds", str(row.n)))
    items.append(("p_front", "unknown (one seed)" if row.p_front is None else
                  f"{row.p_front:.2f}" + (" · within noise of a neighbour" if row.tied else "")))
    if row.trial.rungs:
        last = row.trial.rungs[-1]
        items += [(k, f"{v:.4g}") for k, v in last.metrics.items() if k not in row.values]
    if row.trial.wall_time is not None:
        items.append(("wall time", f"{row.trial.wall_time:.0f} s"))
    return items


PAGE = 25  # front rows shown open; the rest in closed pages of as many (a browser lays out only what is open)


def front_table(exp: Experiment, diagrams: dict[str, str | None]) -> str:
    head = "<tr><th>trial</th><th>architecture</th><th>cost</th><th>metrics</th><th>diagram</th></tr>"
    body, drawn = [], {}
    for i in exp.front:  # in cost order
        r = exp.rows[i]
        knee = ' class="knee"' if i == exp.knee else ""
        params = ", ".join(f"{k}={v}" for k, v in r.trial.params.items())
        uri = diagrams.get(r.trial.id)
        if r.trial.id in drawn:  # an elastic trial's other loop counts: one diagram is enough
            img = f"as {escape(drawn[r.trial.id])}"
        else:
            img = f'<img class="diagram" loading="lazy" alt="diagram of {escape(r.label)}" src="{uri}">' if uri else "—"
            drawn[r.trial.id] = r.label
        body.append(
            f"<tr{knee}><td><b>{escape(r.label)}</b>{'<br>★ knee' if knee else ''}</td>"
            f"<td>{escape(r.summary)}<br><small>{escape(params)}</small></td>"
            f"<td>{_dl(cost_items(r))}</td><td>{_dl(metric_items(exp, r))}</td><td>{img}</td></tr>")
    pages = [body[n:n + PAGE] for n in range(0, len(body), PAGE)] or [[]]
    html = f"<table>{head}{''.join(pages[0])}</table>"
    for n, page in enumerate(pages[1:], start=1):
        html += (f"<details><summary>front members {n * PAGE + 1}–{n * PAGE + len(page)} of {len(body)}</summary>"
                 f"<table>{head}{''.join(page)}</table></details>")
    return html


def header(exp: Experiment) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(exp.counts.items())) or "no trials yet"
    objectives = ", ".join(f"{o.name} ({o.direction})" for o in exp.objectives)
    html = (f"<h1>{escape(exp.record.name)}</h1><p class='meta'>{len(exp.trials)} of "
            f"{exp.record.trials} trials: {escape(counts)} · objectives: {escape(objectives)} · "
            f"context {exp.seq_len} · {plural(len(exp.rows), 'point')} on the charts, "
            f"{len(exp.front)} on the front · generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>")
    if exp.noise:
        html += f"<p class='noise'><b>Seed noise.</b> {escape(exp.noise)}</p>"
    running = exp.counts.get("running", 0)
    if running:
        html += (f"<p class='note'>The sweep is still running ({plural(running, 'trial')} in "
                 "progress): this is a partial report; run <code>loopnas report</code> again to "
                 "refresh.</p>")
    if exp.excluded:
        items = "".join(f"<li>{escape(e)}</li>" for e in exp.excluded)
        html += (f"<details><summary>{plural(len(exp.excluded), 'point')} left out</summary>"
                 f"<ul>{items}</ul></details>")
    return html


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def document(title: str, body: list[str]) -> list[str]:
    """The page in parts, ``body`` among them as given (``runners.checkpoint.write_text``
    writes them one after another)."""
    return [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>", *body, "</body></html>"]


__all__ = ["PAGE", "diagram_uri", "document", "front_table", "header", "plotly_script", "value_text"]
