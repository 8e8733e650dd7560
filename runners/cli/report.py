"""``loopnas report EXPERIMENT_DIR``: the Pareto report of a sweep, finished or running."""
from __future__ import annotations

import errno
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import SeqLenOpt, UsageError, console

ExpArg = Annotated[Path, typer.Argument(help="Experiment directory written by `loopnas sweep`.", show_default=False)]


def front_table(exp):
    """The front (``runners.results.table.front_table``, as status prints it) with the knee
    marked ★ and each member's unique parameters, inference memory and, where no objective
    is projection compute, its projection FLOPs per token."""
    from nas.units import nbytes, si
    from runners.report.page import plural
    from runners.results.table import front_table as table

    rows = exp.members
    extra = {} if any(o.metric == "projection_flops" for o in exp.objectives) else \
        {"proj FLOPs/tok": [si(r.compute) for r in rows]}
    extra |= {"params": [si(r.params) for r in rows], f"memory@{exp.seq_len}": [nbytes(r.memory) for r in rows]}
    title = f"{exp.record.name}: Pareto front ({len(exp.front)} of {plural(len(exp.points), 'point')}; ★ knee)"
    return table(exp.front_entries(), exp.objectives, noisy=exp.record.seeds > 1, title=title,
                 knee=exp.front.index(exp.knee) if exp.knee is not None else None, extra=extra)


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
        from runners.results.table import noise_line

        console.print(front_table(exp))
        if exp.noise:
            console.print(noise_line(exp.front_entries(), exp.noise), highlight=False, markup=False)
    else:
        console.print("no complete trials with evaluated points yet: the report has no charts")
    for line in exp.excluded:
        console.print(f"left out: {line}", highlight=False, markup=False)
    console.print(f"report: {report.index}", highlight=False, soft_wrap=True, markup=False)
