"""Whose weights an export carries, and the check that they are the exported spec's.

A trial of a seeded sweep (``proxy.seeds > 1``) has one checkpoint per replicate
(:func:`runners.results.records.checkpoint_of`); by default the export takes the replicate
whose quality is nearest the candidate's mean (the value the front and the pick saw), or
the one ``--replicate`` names. Whatever the source, the checkpoint must hold weights of the
spec being exported: its own spec (the trainer writes it into the checkpoint) and the
trainer's ``result.json`` beside it must have the exported spec's fingerprint, up to the
vocabulary the proxy task rewrote and the name.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from nas.spec import ArchSpec, stored_spec
from runners.checkpoint import RESULT
from runners.results.records import (
    Objective, RecordError, Replicate, Skipped, TrialRecord, checkpoint_of, read_bounded,
)

from .pick import ExportError


@dataclass(frozen=True)
class Weights:
    """A checkpoint's weights and the spec they belong to, with where they came from."""

    checkpoint: Path
    state: dict
    arch: ArchSpec                 # the exported spec at the vocabulary it was trained with
    trial: str | None = None
    replicate: int | None = None   # the replicate index (None: the trial's one run, or no trial)
    seed: int | None = None
    replicates: int = 1
    why: str = ""

    def manifest(self) -> dict:
        return {"checkpoint": str(self.checkpoint), "trial": self.trial, "replicate": self.replicate,
                "seed": self.seed, "replicates": self.replicates, "why": self.why}

    def sentence(self) -> str:
        """Where the weights come from, for the README (empty for a trial of one run)."""
        if self.replicate is None:
            return ""
        return (f"The weights are those of replicate {self.replicate} (seed {self.seed}) of the "
                f"{self.replicates} that trained trial {self.trial} (`{self.checkpoint}`): {self.why}.")


def fingerprint(arch: ArchSpec) -> str:
    """The architecture's identity without its labels (name, description)."""
    data = arch.model_dump(mode="json", exclude={"name", "description"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if isinstance(exc, Skipped):  # read_bounded's refusal: an oversized file
        return str(exc)
    if not callable(errors):
        return type(exc).__name__
    first = errors()[0]
    if first["type"] == "json_invalid":
        return f"not JSON: {first['msg']}"
    return f"{'.'.join(map(str, first['loc'])) or 'the top level'}: {first['msg']}"


def _trained_specs(path: Path, ckpt: dict) -> list[tuple[str, ArchSpec]]:
    """The specs the checkpoint says it trained: its own, and its run's ``result.json``."""
    from pydantic import ValidationError

    from runners.train import TrainResult

    found = []
    if isinstance(ckpt.get("arch"), dict):
        try:
            found.append((str(path), stored_spec(ckpt["arch"])))
        except ValidationError as exc:
            raise ExportError(f"{path}: the spec it was trained with no longer validates "
                              f"({_first_error(exc)})") from None
    result = path.parent / RESULT
    if result.is_file():
        try:
            found.append((str(result), TrainResult.model_validate_json(read_bounded(result)).arch))
        except (OSError, ValueError) as exc:  # pydantic's ValidationError and Skipped are ValueErrors
            raise ExportError(f"{result}: unreadable trainer result beside the checkpoint "
                              f"({_first_error(exc)}); restore it or move it away") from None
    return found


def owner(spec: ArchSpec, path: Path, ckpt: dict, state: dict) -> ArchSpec:
    """``spec`` at the vocabulary the checkpoint was trained with (the proxy task's, read from
    the embedding), once the checkpoint is shown to hold ``spec``'s weights: the specs it
    names must have ``spec``'s fingerprint at one vocabulary (a mismatch is one line naming
    both)."""
    from runners.train import with_vocab

    vocab = spec.model.vocab_size
    for where, arch in _trained_specs(path, ckpt):
        theirs, ours = fingerprint(with_vocab(arch, vocab)), fingerprint(spec)
        if theirs != ours:
            raise ExportError(f"{where} is of {arch.name} (fingerprint {theirs}), not of {spec.name} "
                              f"(fingerprint {ours}): give a checkpoint of {spec.name}, or export {arch.name}")
    embed = state.get("embed.weight", state.get("_orig_mod.embed.weight"))
    return spec if embed is None else with_vocab(spec, int(embed.shape[0]))


def _quality(objectives: list[Objective]) -> str | None:
    measured = [o for o in objectives if o.quality] or [o for o in objectives if o.measured]
    return measured[0].name if measured else None


def _value(points, k: int | None, metric: str) -> float | None:
    value = next((p.values.get(metric) for p in points if p.k == k), None)
    return value if value is not None and math.isfinite(value) else None


def nearest(trial: TrialRecord, objectives: list[Objective], k: int | None) -> tuple[Replicate, str]:
    """The complete replicate whose quality at loop count ``k`` is nearest the candidate's
    mean (the lowest index among equally near ones), and why, in words."""
    done = [r for r in trial.replicates if r.status == "complete"]
    if not done:
        raise ExportError(f"trial {trial.id} has no complete replicate to take weights from")
    metric = _quality(objectives)
    scored = [(r, v) for r in done if metric and (v := _value(r.points, k, metric)) is not None]
    if not scored:
        return done[0], "the first complete replicate (no measured objective to compare them by)"
    mean = _value(trial.points, k, metric)
    mean = sum(v for _, v in scored) / len(scored) if mean is None else mean
    best = min(abs(v - mean) for _, v in scored)
    near = [(r, v) for r, v in scored if math.isclose(abs(v - mean), best, rel_tol=1e-9, abs_tol=1e-12)]
    r, v = near[0]
    at = f" at k={k}" if k is not None else ""
    if len(near) == 1:
        why = (f"its {metric}{at}, {v:.6g}, is the nearest of the {len(scored)} replicates' to the "
               f"candidate's mean {mean:.6g}")
    else:
        why = (f"{len(near)} replicates' {metric}{at} are equally near the candidate's mean {mean:.6g} "
               f"({', '.join(f'{x:.6g}' for _, x in near)}); the first of them is taken")
    return r, why + "; `--replicate i` exports another"


def replicate_of(trial: TrialRecord, objectives: list[Objective], k: int | None,
                 replicate: int | None) -> tuple[Replicate | None, str]:
    """The replicate whose checkpoint to export (None: the trial's one run) and why."""
    reps = trial.replicates
    if len(reps) <= 1:
        if replicate not in (None, *(r.index for r in reps), 0):
            raise ExportError(f"--replicate {replicate}: trial {trial.id} was trained once (one seed)")
        return None, ""
    if replicate is None:
        return nearest(trial, objectives, k)
    found = next((r for r in reps if r.index == replicate), None)
    if found is None:
        raise ExportError(f"--replicate {replicate}: trial {trial.id} has replicates "
                          f"{', '.join(str(r.index) for r in reps)}")
    if found.status != "complete":
        raise ExportError(f"--replicate {replicate}: that replicate of trial {trial.id} did not complete "
                          f"({found.status}{': ' + found.reason if found.reason else ''})")
    return found, "chosen with --replicate"


def trial_checkpoint(exp_dir: Path, trial: TrialRecord, objectives: list[Objective], k: int | None,
                     replicate: int | None) -> tuple[Path, Replicate | None, str]:
    """The checkpoint to export a trial with: its path, its replicate, and why that one."""
    rep, why = replicate_of(trial, objectives, k, replicate)
    try:
        path = checkpoint_of(exp_dir, trial, rep.index if rep is not None else None)
    except RecordError as exc:
        raise ExportError(str(exc)) from None
    if not path.is_file():
        raise ExportError(f"trial {trial.id} has no checkpoint ({path}); export without --with-weights")
    return path, rep, why


__all__ = ["Weights", "fingerprint", "owner", "nearest", "replicate_of", "trial_checkpoint"]
