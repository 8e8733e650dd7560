"""``loopnas status DIR``: counts by status and the current front of a running or finished sweep."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from runners.nogc import paused_gc
from runners.results.status import FAILURES, SHOWN

from . import app
from .common import JsonOpt, UsageError, console, console_err


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
    from runners.results.experiment import from_digests
    from runners.results.records import read_experiment, read_index, study_storage

    exp = read_experiment(exp_dir)
    unreadable: list = []
    digests = read_index(exp_dir, problems=unreadable)  # incremental: only changed records are read
    counts = {s: sum(d["status"] == s for d in digests) for s in SHOWN}
    model = from_digests(exp_dir, exp, digests)  # only the candidates that can reach the front made records
    elastic = sum(1 for d in digests if d["status"] == "complete" and len(d["points"]) > 1)
    url = (exp.space.get("search") or {}).get("storage")
    storage = exp.storage if url and exp.storage else study_storage(exp_dir, url)  # a journal moves with the directory
    return {"experiment": exp.name, "dir": str(exp_dir), "storage": storage, "engine": exp.engine,
            "requested": exp.trials, "unreadable": [str(p) for p in unreadable],
            **counts, "elastic_trials": elastic, "seeds": exp.seeds, "devices": per_device(digests),
            "objectives": [o.model_dump() for o in exp.objectives],
            "noise": model.noise,
            **_transfer_entry(exp_dir),  # loopnas transfer's verdict and tau, when EXP/transfer/ has one
            "front": model.front_entries(),
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
    console.print(f"[bold]{escape(data['experiment'])}[/bold] ({escape(data['engine'])}, {data['requested']} "
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
        from runners.results.records import Objective
        from runners.results.table import front_table, noise_line

        objectives = [Objective.model_validate(o) for o in data["objectives"]]
        console.print(front_table(data["front"], objectives, noisy=data["seeds"] > 1))
        console.print(noise_line(data["front"], data["noise"]), highlight=False, markup=False)
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
