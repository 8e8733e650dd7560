"""The one terminal table of a front: ``loopnas status`` and ``loopnas report`` (and the end
of ``loopnas sweep``) print it; and an objective's value in its unit, which the report page
shows too. ``rich`` is imported only when a table is made."""
from __future__ import annotations

from nas.units import nbytes, si

from .records import Objective


def value_text(objective: Objective, value: float) -> str:
    """An objective's value in its unit: quality as measured, bytes, ms, tokens/s, counts."""
    metric = objective.metric
    if objective.quality:
        return f"{value:.4g}"
    if metric.endswith("bytes"):
        return nbytes(value)
    if metric == "decode_latency_ms":
        return f"{value:.4g} ms"
    if metric.endswith("tokens_per_s"):
        return f"{si(value)} tok/s"
    return si(value)


def cell(objective: Objective, value: float, se: float | None = None) -> str:
    """A front member's objective in the table: a serving cost in its unit, the others to 4
    significant digits; ``± se`` where its seed noise is known and not zero."""
    text = value_text(objective, value) if objective.serving else f"{value:.4g}"
    return text if not se else f"{text} ± {se:.2g}"


def front_table(entries: list[dict], objectives: list[Objective], noisy: bool, title: str = "Pareto front",
                knee: int | None = None, extra: dict[str, list[str]] | None = None):
    """A ``rich`` table of the front, in its order: ``entries`` as ``Experiment.front_entries``
    gives them (status's JSON), a column per objective (its arrow, ``± s.e.``), the loop
    count where a member is an elastic trial's, ``p_front`` (≈: within noise of a neighbour)
    when the experiment has seeds (``noisy``), the columns of ``extra`` (a header and a cell
    per member), the architecture. ``knee``: the position of the knee, marked ★."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title))
    table.add_column("trial")
    elastic = any(p["k"] is not None for p in entries)
    if elastic:
        table.add_column("k", justify="right")
    for o in objectives:
        table.add_column(f"{escape(o.name)} {'↑' if o.direction == 'maximize' else '↓'}", justify="right")
    if noisy:
        table.add_column("p_front", justify="right")
    for name in extra or {}:
        table.add_column(escape(name), justify="right")
    table.add_column("architecture")
    for n, p in enumerate(entries):
        noise = [f"{p['p_front']:.2f}{' ≈' if p['tied'] else ''}" if p["p_front"] is not None else "?"] if noisy else []
        k = ["" if p["k"] is None else str(p["k"])] if elastic else []
        table.add_row(escape(p["trial"]) + (" ★" if n == knee else ""), *k,
                      *[cell(o, p["values"][o.name], p["se"][o.name]) for o in objectives],
                      *noise, *(escape(cells[n]) for cells in (extra or {}).values()), escape(p["summary"] or ""))
    return table


def noise_line(entries: list[dict], noise: str) -> str:
    """The line under the table: the front's noise sentence, and what ≈ means where a member has it."""
    return noise + (" (≈: within noise of a neighbour)" if any(p["tied"] for p in entries) else "")


__all__ = ["cell", "front_table", "noise_line", "value_text"]
