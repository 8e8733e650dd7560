"""Which trial of an experiment to export: by id, or picked from the Pareto front.

The experiment is the read-model's (:func:`runners.results.experiment.load`; past
``WHOLE`` trials ``from_digests``, as status reads it): every complete trial with a spec
contributes its points (an elastic trial one per evaluated loop
count ``k``), each with a finite value for every objective. ``knee`` is the front's knee
(:func:`nas.pareto.knee_point`); ``best-quality`` the best value of the proxy's quality
objective, ``cheapest`` the best value of the first cost-model objective (the first
measured serving cost when there is none), each with ties broken by the remaining
objectives in order (so both lie on the front).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nas.errors import LoopnasError
from runners.results import experiment, records
from runners.results.experiment import Experiment, TrialPoint, points_of
from runners.results.front import cost_objectives, finite_values
from runners.results.records import (
    ExperimentRecord, Objective, RecordError, TrialRecord, read_experiment, read_index, read_record, read_trials,
    trial_path,
)

Pick = Literal["knee", "best-quality", "cheapest"]
PICKS = ("knee", "best-quality", "cheapest")


class ExportError(LoopnasError):
    """A request the export cannot satisfy: one line for the user."""


def label(point: TrialPoint) -> str:
    """A point as the export names it: ``t0004``, ``t0004 at k=2``."""
    return point.trial.id if point.k is None else f"{point.trial.id} at k={point.k}"


@dataclass(frozen=True)
class Choice:
    experiment: ExperimentRecord
    trial: TrialRecord
    k: int | None                  # the loop count the chosen point was evaluated at
    how: str                       # one sentence: why this trial
    values: dict[str, float]       # its objective values (empty for a trial without points)
    front: tuple[str, ...]         # labels of the front's members


def read(exp_dir: str | Path, problems: list | None = None) -> tuple[ExperimentRecord, list[TrialRecord]]:
    """The experiment and its readable trials; an unreadable trial record is skipped (and
    appended to ``problems``, :func:`runners.results.records.read_trials`), an unreadable
    experiment record is an :class:`ExportError`."""
    try:
        return read_experiment(exp_dir), read_trials(exp_dir, problems=[] if problems is None else problems)
    except (FileNotFoundError, RecordError) as exc:
        raise ExportError(str(exc)) from None


def _lexicographic(points: list[TrialPoint], order: list[Objective]) -> int:
    sign = {"minimize": 1.0, "maximize": -1.0}
    keys = [tuple(sign[o.direction] * p.values[o.name] for o in order) for p in points]
    return min(range(len(points)), key=lambda i: (keys[i], i))


def pick_index(exp: Experiment, pick: Pick) -> tuple[int, str]:
    """Index (into ``exp.points``) of the picked point and the rule that picked it, in words."""
    objectives = exp.objectives
    if pick == "knee":
        names = ", ".join(f"{o.name} ({o.direction})" for o in objectives)
        return exp.knee, f"the knee of the Pareto front over {names}"
    quality = [o for o in objectives if o.quality]
    first = quality if pick == "best-quality" else cost_objectives(objectives)
    if not first:
        kind = "measured (quality)" if pick == "best-quality" else "cost-model or serving"
        raise ExportError(f"--pick {pick}: the experiment has no {kind} objective")
    order = [first[0]] + [o for o in objectives if o is not first[0]]
    word = "best" if pick == "best-quality" else "lowest"
    return _lexicographic(exp.points, order), f"the {word} {first[0].name} ({first[0].direction}), ties broken by the other objectives"


def _from_digests(exp_dir: Path) -> tuple[Experiment, list[dict], int]:
    """Past ``WHOLE`` trials, the experiment as status reads it (``experiment.from_digests``:
    only the candidates with a spec that can reach the front made records, ranked as all),
    every digest and how many points the trials with a spec have. Every pick lies on the
    front, so it is among those candidates; the chosen one is read whole after."""
    record = read_experiment(exp_dir)
    digests = read_index(exp_dir, problems=[])
    admitted = [d for d in digests if d["has_arch"]]
    names = [o.name for o in record.objectives]
    total = sum(1 for d in admitted if d["status"] == "complete" for p in d["points"]
                if finite_values(p["values"], names))
    return experiment.from_digests(exp_dir, record, admitted), digests, total


def _whole(exp_dir: Path, trial_id: str) -> TrialRecord:
    found, why = read_record(trial_path(exp_dir, trial_id), TrialRecord)
    if found is None or found.arch is None:
        raise ExportError(f"trial {trial_id}: its record cannot be read again ({why or 'no architecture'})")
    return found


def choose(exp_dir: str | Path, trial: str | None = None, pick: Pick | None = None) -> Choice:
    """The trial to export: ``trial`` by id, or ``pick`` over the experiment's points. Past
    ``experiment.WHOLE`` trials from the records' digests (:func:`_from_digests`), as status
    reads them: the same choice, without 10,000 whole records in memory."""
    exp_dir = Path(exp_dir)
    digests = None
    try:
        if experiment.trial_files(exp_dir) > experiment.WHOLE:
            exp, digests, total = _from_digests(exp_dir)
        else:
            exp = experiment.load(exp_dir, admit=lambda t: t.arch is not None)  # only a trial with a spec is exported
            total = len(exp.points)
    except (FileNotFoundError, RecordError) as exc:
        raise ExportError(str(exc)) from None
    if (trial is None) == (pick is None):
        raise ExportError("give exactly one of --trial ID or --pick knee|best-quality|cheapest")
    front = tuple(label(p) for p in exp.members)
    if trial is not None:
        ids = [d["id"] for d in digests] if digests is not None else [t.id for t in exp.trials]
        if trial not in ids:
            known = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
            raise ExportError(f"no trial {trial!r} in {exp_dir} (trials: {known or 'none'})")
        if digests is None:
            found = next(t for t in exp.trials if t.id == trial)
        else:
            d = digests[ids.index(trial)]
            found = _whole(exp_dir, trial) if d["has_arch"] else records.undigest(d)
        if found.arch is None:
            raise ExportError(f"trial {trial} has no architecture (status {found.status})")
        mine = points_of(found, exp.objectives)
        return Choice(exp.record, found, None, f"trial {trial}, chosen by id (--trial)",
                      _objectives(mine[-1], exp.objectives) if mine else {}, front)
    if pick not in PICKS:
        raise ExportError(f"--pick must be one of {', '.join(PICKS)} (got {pick!r})")
    if not exp.points:
        raise ExportError(f"{exp_dir} has no complete trial with a value for every objective "
                          f"({', '.join(o.name for o in exp.objectives)})")
    i, how = pick_index(exp, pick)
    p = exp.points[i]
    chosen = p.trial if digests is None else _whole(exp_dir, p.trial.id)
    return Choice(exp.record, chosen, p.k, f"{label(p)}, picked by --pick {pick}: {how}, among "
                  f"{total} points of complete trials", _objectives(p, exp.objectives), front)


def _objectives(point: TrialPoint, objectives: list[Objective]) -> dict[str, float]:
    """The point's value of each objective (a point's record may hold other metrics too)."""
    return {o.name: point.values[o.name] for o in objectives}


def at_scale(exp_dir: str | Path, pick: str) -> tuple[Path, str]:
    """``knee@4x`` (``best-quality@2``, ``cheapest@largest``): the pick rule, and the
    experiment directory of that scale of the sweep's transfer (``EXP/transfer/scale-4x/``,
    ``loopnas transfer``) whose front it picks from; a pick without ``@`` is the sweep's own."""
    rule, at, scale = pick.partition("@")
    if not at:
        return Path(exp_dir), pick
    root = Path(exp_dir) / "transfer"
    made = sorted(p.name[len("scale-"):] for p in root.glob("scale-*") if (p / "experiment.json").is_file())
    if not made:
        raise ExportError(f"--pick {pick}: {exp_dir} has no transfer (run loopnas transfer {exp_dir} first)")
    if scale == "largest":
        from runners.transfer import find
        t = find(exp_dir)
        label = t.scales[-1].label if t is not None else max(made, key=lambda s: float(s.rstrip("x")))
    else:
        label = scale.replace("×", "x") if scale.rstrip("x×") != scale else f"{scale}x"
    if label not in made:
        raise ExportError(f"--pick {pick}: no transfer scale {label} in {root} (scales: {', '.join(made)}, or largest)")
    return root / f"scale-{label}", rule


__all__ = ["Pick", "PICKS", "ExportError", "Choice", "at_scale", "label", "pick_index", "choose"]
