"""The cost axes quality is plotted against, hover text and number formats shared by the
interactive page and the PNGs."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from nas.units import nbytes, si

from .data import Experiment, Row


@dataclass(frozen=True)
class Axis:
    attr: str  # Row.get key: compute, params, memory, or an objective's name
    title: str
    short: str  # for chart titles
    png: str  # file stem under report/
    unit: str = ""
    direction: str = "minimize"

    def fmt(self, x: float) -> str:
        return nbytes(x) if self.unit == "B" else si(x)

    def value(self, row: Row) -> float:
        return row.get(self.attr)

    @property
    def better(self) -> str:
        return "lower is better" if self.direction == "minimize" else "higher is better"


def axes(exp: Experiment) -> list[Axis]:
    return [
        Axis("compute", "projection FLOPs / token", "projection compute", "front_compute"),
        Axis("params", "unique parameters", "unique parameters", "front_params"),
        Axis("memory", f"KV cache + recurrent state / sequence at context {exp.seq_len}",
             f"inference memory at context {exp.seq_len}", "front_memory", "B"),
    ]


_SERVING_TITLES = {
    "train_tokens_per_s": "measured training throughput (tokens/s)",
    "prefill_tokens_per_s": "measured prefill throughput (tokens/s)",
    "decode_tokens_per_s": "measured decode throughput (tokens/s)",
    "decode_latency_ms": "measured decode latency (ms / token)",
    "peak_memory_bytes": "measured peak memory",
    "cache_bytes": "measured inference cache",
}


def serving_axes(exp: Experiment) -> list[Axis]:
    """One axis per measured serving objective (``runners.bench``), in its own direction."""
    out = []
    for o in exp.objectives:
        if not o.serving:
            continue
        metric = o.metric
        title = f"{_SERVING_TITLES.get(metric, metric)} [{o.name}]"
        stem = "front_" + "".join(c if c.isalnum() else "_" for c in o.name)
        unit = "B" if metric.endswith("bytes") else ""
        out.append(Axis(o.name, title, o.name, stem, unit, o.direction))
    return out


def quality_title(exp: Experiment) -> str:
    q = exp.quality
    return f"{q.name} ({'higher' if q.direction == 'maximize' else 'lower'} is better)"


def hover(exp: Experiment, row: Row) -> str:
    """Plotly hover text: trial and k, architecture summary, objectives, costs, parameters."""
    lines = [f"<b>{row.label}</b>"] + textwrap.wrap(row.summary, 70)
    lines += [f"{o.name} = {row.values[o.name]:.4g}" for o in exp.objectives]
    lines.append(f"projection FLOPs/token {si(row.compute)} · params {si(row.params)}"
                 f" · memory {nbytes(row.memory)}")
    if row.trial.params:
        lines += textwrap.wrap(", ".join(f"{k}={v}" for k, v in row.trial.params.items()), 70)
    return "<br>".join(lines)


def log_scale(values: list[float]) -> bool:
    """Log axis when the values are positive and span more than a factor of 20."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 20


__all__ = ["Axis", "axes", "serving_axes", "hover", "log_scale", "nbytes", "quality_title", "si"]
