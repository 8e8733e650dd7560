"""What the Optuna dashboard shows of a loopnas study (``optuna-dashboard EXP/study.journal
--artifact-dir EXP/artifacts``): on each trial, before it is told, its summary and every
objective's mean and standard error as user attributes and its canonical spec as an
artifact (Optuna's ``FileSystemArtifactStore`` in ``EXP/artifacts``); at the end of the
sweep, the front with each member's ``p_front`` as the study's user attributes (Optuna
refuses to change a finished trial's), and, where optuna-dashboard is installed, a note on
each member's trial saying it."""
from __future__ import annotations

import json
import logging
import math
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

from runners.results.records import TrialRecord

ARTIFACTS = "artifacts"
log = logging.getLogger("loopnas.track")


def _warned(fn):
    """A failure here (a full disk under the artifact store) is one warning, not the sweep's end."""
    def safe(*args):
        try:
            fn(*args)
        except Exception as exc:
            log.warning("warning: the Optuna study's %s failed (%s: %s); the sweep goes on", fn.__name__.strip("_"),
                        type(exc).__name__, " ".join(str(exc).split())[:300])
    safe.__name__, safe.__doc__ = fn.__name__.strip("_"), fn.__doc__
    return safe


@_warned
def annotate(trial, record: TrialRecord, out: Path) -> None:
    """The record on its (still running) Optuna trial: ``summary``, ``<objective>_mean``,
    ``<objective>_se``, ``seeds``, and the spec as the artifact ``spec.json``."""
    if record.summary:
        trial.set_user_attr("summary", record.summary)
    if record.points:
        point = record.points[-1]
        for name, value in point.values.items():
            trial.set_user_attr(f"{name}_mean", _number(value))
            if name in point.se:
                trial.set_user_attr(f"{name}_se", _number(point.se[name]))
        trial.set_user_attr("seeds", point.n)
    if record.arch is not None:
        upload(trial, "spec.json", json.dumps(record.arch, indent=2), out)


def upload(trial, name: str, text: str, out: Path) -> str:
    """``text`` as the artifact ``name`` of ``trial`` in the experiment's artifact store."""
    import optuna
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    store = Path(out) / ARTIFACTS
    store.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        path = Path(tmp) / name
        path.write_text(text)
        return upload_artifact(artifact_store=FileSystemArtifactStore(str(store)), file_path=str(path),
                               study_or_trial=trial, mimetype="application/json")


@_warned
def mark_front(study, front: list, records: dict[str, TrialRecord]) -> None:
    """The front (``runners.results.front.FrontPoint``, computed once at the end) on the study:
    ``p_front`` (loopnas id → probability) and ``front`` (the members in cost order), and a
    note on each member's trial when optuna-dashboard is installed."""
    numbers = {}
    for t in study.get_trials(deepcopy=False):
        rid = (t.user_attrs.get("loopnas") or {}).get("id")
        if rid is not None and t.state.is_finished():
            numbers[rid] = t  # the last trial of an id: a resumed candidate's re-run
    study.set_user_attr("p_front", {p.trial: _number(p.p_front) for p in front if p.k is None})
    study.set_user_attr("front", [f"{p.trial}{'' if p.k is None else f'@k={p.k}'}" for p in front])
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return
    for p in front:
        t = numbers.get(p.trial)
        if t is None:
            continue
        means = ", ".join(f"{n} {v:.4g}" + (f" ± {p.se[n]:.2g}" if n in p.se else "") for n, v in p.values.items())
        chance = "unknown (one seed)" if p.p_front is None else f"{p.p_front:.2f}"
        body = (f"**On the loopnas front**{'' if p.k is None else f' at k = {p.k}'}: p_front {chance} "
                f"(mean of {p.n} seeds: {means}).\n\n{records[p.trial].summary or ''}")
        # save_note takes a live trial for its storage and ids; a finished one is given as such
        save_note(SimpleNamespace(storage=study._storage, study=study, _trial_id=t._trial_id), body)


def _number(value):
    return None if value is None or isinstance(value, float) and not math.isfinite(value) else value


__all__ = ["annotate", "mark_front", "upload", "ARTIFACTS"]
