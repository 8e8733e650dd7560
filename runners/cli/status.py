"""``loopnas status DIR``: counts by status and the current front of a running or finished sweep."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from runners.nogc import paused_gc
from runners.results.status import FAILURES, SHOWN

from . import app
from .common import JsonOpt, UsageError, console, console_err



def _fmt(x: float, se: float | None = None) -> str:
    return f"{x:.4g}" if not se else f"{x:.4g} ± {se:.2g}"


def _se(point, objectives) -> dict[str, float | None]:
    """Each objective's standard error: 0 for cost-model values, None when unknown."""
    return {o.name: point.se.get(o.name) if o.measured else 0.0 for o in objectives}


def per_device(records) -> dict[str, int]:
    """Trials per device they ran on (``node/device`` when they ran on several nodes);
    ``records``: trial records or their digests (``runners.results.records.read_index``)."""
    records = [r if isinstance(r, dict) else {"node": r.node, "devices": r.devices} for r in records]
    nodes = {r["node"] for r in records if r["devices"]}
    out: dict[str, int] = {}
    for r in records:
        for d in r["devices"]:
            key = f"{r['node']}/{d}" if len(nodes) > 1 else d
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _replicates(d: dict, k, names: list[str], measured: list[tuple[int, str]],
                values: dict) -> tuple[list[list[float]], list[int] | None]:
    """A digest's replicate rows and seeds at ``k``, as ``front.replicate_rows``/``replicate_seeds``
    give them for its record: ``names`` the objectives, ``measured`` (position, name) of the
    measured ones (a replicate's own value where it has one, else ``values``)."""
    fixed = [values[n] for n in names]
    rows, seeds = [], []
    for _, seed, status, points in d["reps"]:
        if status != "complete":
            continue
        for pk, rep in points:
            if pk == k:
                row = fixed.copy()
                for i, n in measured:
                    if n in rep:
                        row[i] = rep[n]
                rows.append(row)
                seeds.append(seed)
                break
    return rows or [fixed], seeds or None


def front_records(digests: list[dict], objectives) -> list:
    """The trial records (from their digests) whose points can reach the front: the others
    are dominated in every draw of the p_front bootstrap (``nas.noise.front_candidates``),
    so ``runners.results.front.front`` of these is the front of all, with the same p_front."""
    from nas.noise import front_candidates
    from runners.results.records import undigest

    names = [o.name for o in objectives]
    measured = [(i, o.name) for i, o in enumerate(objectives) if o.measured]
    owners, reps, seeds = [], [], []
    for n, d in enumerate(digests):
        if d["status"] != "complete":
            continue
        for p in d["points"]:
            values = p["values"]
            if all(name in values and values[name] is not None and math.isfinite(values[name]) for name in names):
                rows, s = _replicates(d, p["k"], names, measured, values)
                owners.append(n)
                reps.append(rows)
                seeds.append(s)
    if not reps:
        return []
    keep = front_candidates(reps, [o.direction for o in objectives], seeds=seeds)
    return [undigest(digests[n]) for n in sorted({owners[i] for i in keep})]


TRANSFER_DIR, ONESHOT_SUMMARY = "transfer", "oneshot.json"  # runners.transfer.TRANSFER, runners.report.oneshot.SUMMARY


def _transfer_entry(exp_dir: Path) -> dict:
    """``runners.transfer.status_entry``; the package (pydantic models of spaces and specs) is
    imported only where the experiment has a transfer directory, so status starts fast."""
    if not os.path.lexists(Path(exp_dir) / TRANSFER_DIR):
        return {}
    from runners.transfer import status_entry
    return status_entry(exp_dir)


def _oneshot_check(exp_dir: Path) -> dict | None:
    """``runners.report.oneshot.read_check``, importing the report package only where the
    experiment has a one-shot summary."""
    if not os.path.lexists(Path(exp_dir) / ONESHOT_SUMMARY):
        return None
    from runners.report.oneshot import read_check
    return read_check(exp_dir)


@paused_gc()  # millions of acyclic JSON objects: the cyclic collector's passes cost a third (runners.nogc)
def status_data(exp_dir: Path) -> dict:
    from runners.results.front import front, noise_sentence, quality_name
    from runners.results.records import read_experiment, read_index, study_storage

    exp = read_experiment(exp_dir)
    unreadable: list = []
    digests = read_index(exp_dir, problems=unreadable)  # incremental: only changed records are read
    counts = {s: sum(d["status"] == s for d in digests) for s in SHOWN}
    points = front(front_records(digests, exp.objectives), exp.objectives)
    elastic = sum(1 for d in digests if d["status"] == "complete" and len(d["points"]) > 1)
    url = (exp.space.get("search") or {}).get("storage")
    storage = exp.storage if url and exp.storage else study_storage(exp_dir, url)  # a journal moves with the directory
    return {"experiment": exp.name, "dir": str(exp_dir), "storage": storage, "backend": exp.backend,
            "requested": exp.trials, "unreadable": [str(p) for p in unreadable],
            **counts, "elastic_trials": elastic, "seeds": exp.seeds, "devices": per_device(digests),
            "objectives": [o.model_dump() for o in exp.objectives],
            "noise": noise_sentence(points, quality_name(exp.objectives), exp.seeds),
            **_transfer_entry(exp_dir),  # loopnas transfer's verdict and tau, when EXP/transfer/ has one
            "front": [{"trial": p.trial, "k": p.k, "values": p.values, "se": _se(p, exp.objectives),
                       "n": p.n, "p_front": p.p_front, "tied": p.tied, "summary": p.summary}
                      for p in points],
            "failures": [{"trial": d["id"], "status": d["status"], "reason": d["reason"]} for d in digests
                         if d["status"] in FAILURES],
            "oneshot_check": _oneshot_check(exp_dir)}  # a one-shot sweep's self-check, else None


def finite(data):
    """``data`` with every NaN or infinite number as None: JSON has no NaN (one replicate's
    unknown standard error, a diverged metric)."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def warn_unreadable(data: dict) -> None:
    """One warning line per skipped record, on stderr (stdout may be JSON)."""
    for line in data["unreadable"]:
        console_err.print(f"warning: {line}; skipped", markup=False, highlight=False)


def print_status(exp_dir: Path) -> None:
    data = status_data(exp_dir)
    warn_unreadable(data)
    counts = " · ".join(f"{data[s]} {s}" for s in SHOWN if data[s])
    console.print(f"[bold]{escape(data['experiment'])}[/bold] ({escape(data['backend'])}, {data['requested']} "
                  "trials requested): "
                  f"{counts or 'no trials yet'}"
                  + (f" · {data['elastic_trials']} elastic trials (one point per loop count)" if data["elastic_trials"] else ""))
    if data["devices"]:
        console.print("trials per device: " + " · ".join(f"{d}: {n}" for d, n in data["devices"].items()),
                      highlight=False, markup=False)
    console.print(f"study: {data['storage']}", markup=False, highlight=False)
    if not data["front"]:
        console.print("no complete trial yet: no front")
    else:
        table = Table(title="Pareto front")
        table.add_column("trial")
        elastic = any(p["k"] is not None for p in data["front"])
        if elastic:
            table.add_column("k", justify="right")
        for o in data["objectives"]:
            arrow = "↑" if o["direction"] == "maximize" else "↓"
            table.add_column(f"{escape(o['name'])} {arrow}", justify="right")
        noisy = data["seeds"] > 1
        if noisy:
            table.add_column("p_front", justify="right")
        table.add_column("architecture")
        for p in data["front"]:
            extra = [f"{p['p_front']:.2f}{' ≈' if p['tied'] else ''}" if p["p_front"] is not None else "?"] if noisy else []
            k = ["" if p["k"] is None else str(p["k"])] if elastic else []
            table.add_row(escape(p["trial"]), *k,
                          *[_fmt(p["values"][o["name"]], p["se"][o["name"]]) for o in data["objectives"]],
                          *extra, escape(p["summary"] or ""))
        console.print(table)
        tied = any(p["tied"] for p in data["front"])
        console.print(data["noise"] + (" (≈: within noise of a neighbour)" if tied else ""), highlight=False,
                      markup=False)
    for f in data["failures"][:5]:
        console.print(f"{f['trial']} {f['status']}: {f['reason']}", highlight=False, markup=False)
    if data["oneshot_check"]:
        console.print(f"one-shot self-check: {data['oneshot_check']['verdict']}", highlight=False, markup=False,
                      soft_wrap=True)


@app.command("status")
def status_cmd(
    exp_dir: Annotated[Path, typer.Argument(help="An experiment directory written by loopnas sweep.", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Counts by status and the current Pareto front of a running or finished sweep.

    Example: loopnas status runs/quickstart --json
    """
    try:
        with paused_gc():  # the digests stay alive to the end: no collector passes over them (runners.nogc)
            data = status_data(exp_dir) if as_json else None
            if as_json:
                warn_unreadable(data)
                typer.echo(json.dumps(finite(data), indent=2, allow_nan=False))
            else:
                print_status(exp_dir)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(str(exc)) from None
