"""``loopnas report EXPERIMENT_DIR``: the Pareto report of a sweep, finished or running."""
from __future__ import annotations

import errno
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import app
from .common import SeqLenOpt, UsageError, console

ExpArg = Annotated[Path, typer.Argument(help="Experiment directory written by `loopnas sweep`.", show_default=False)]


def front_table(exp) -> Table:
    """The front, cheapest projection compute first; the knee marked ★. The quality and
    serving objectives have a column each; cost objectives appear among the cost columns."""
    from nas.units import nbytes, si
    from runners.report.page import plural, value_text
    measured = [o for o in exp.objectives if o.quality] + [o for o in exp.objectives if o.serving]
    table = Table(title=f"{escape(exp.record.name)}: Pareto front ({len(exp.front)} of "
                        f"{plural(len(exp.rows), 'point')}; ★ knee)")
    table.add_column("trial", no_wrap=True)
    for col in (*(o.name for o in measured), "proj FLOPs/tok", "params", f"memory@{exp.seq_len}"):
        table.add_column(escape(col), justify="right", no_wrap=True)
    table.add_column("architecture", ratio=1, min_width=20)
    for i in sorted(exp.front, key=lambda i: (exp.rows[i].compute, exp.rows[i].label)):
        r = exp.rows[i]
        table.add_row(escape(r.label) + (" ★" if i == exp.knee else ""),
                      *(escape(value_text(o, r.values[o.name])) for o in measured),
                      si(r.compute), si(r.params), nbytes(r.memory), escape(r.summary))
    return table


def write_problem(exc: OSError, what: str, then: str) -> str:
    """One line for a failed write: what failed, the file, why, and what to do ``then``."""
    where = f" ({exc.filename})" if exc.filename else ""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return f"{what}{where}: {exc.strerror or exc}; {'free some space, then ' if full else ''}{then}"


@app.command("report")
def report_cmd(experiment: ExpArg, seq_len: SeqLenOpt = None) -> None:
    """Write EXPERIMENT_DIR/report/: index.html (interactive charts, opens offline),
    PNGs of the main charts and front.csv; print the front.

    Works while the sweep is running: only complete trials are plotted.

    Example: loopnas report runs/quickstart
    """
    if seq_len is not None and seq_len < 1:
        raise UsageError(f"--seq-len must be a positive integer (got {seq_len})")
    from runners.nogc import paused_gc

    with paused_gc():  # imports, records and figures included: the collector's passes cost seconds at scale
        _report(experiment, seq_len)


def _report(experiment: Path, seq_len: int | None) -> None:
    from runners.report import write_report  # plotly and matplotlib only here

    try:
        report = write_report(experiment, seq_len=seq_len)
    except FileNotFoundError as exc:  # no experiment there (a damaged record is a RecordError)
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a full disk, a read-only directory, report/ that is a file
        raise UsageError(write_problem(exc, f"cannot write the report in {experiment / 'report'}",
                                       f"run  loopnas report {experiment}  again")) from None
    exp = report.experiment
    counts = ", ".join(f"{n} {s}" for s, n in sorted(exp.counts.items())) or "no trials yet"
    console.print(f"{exp.record.name}: {counts}", highlight=False, markup=False)
    if exp.rows:
        console.print(front_table(exp))
    else:
        console.print("no complete trials with evaluated points yet: the report has no charts")
    for line in exp.excluded:
        console.print(f"left out: {line}", highlight=False, markup=False)
    console.print(f"report: {report.index}", highlight=False, soft_wrap=True, markup=False)
