"""The tracker protocol and the fan-out the sweep driver calls.

The driver (the one writer of the experiment directory) calls the fan-out where it writes
records: :meth:`Tracking.on_start` once the experiment record is written,
:meth:`Tracking.on_replicate` when a replicate ends, :meth:`Tracking.on_candidate` when a
candidate is settled, :meth:`Tracking.on_end` with the front once the budget is spent.
Workers never log, so a Ray cluster needs no tracking credentials on its nodes. A backend
that is not installed or raises is one warning line and is dropped; the sweep goes on.
The run ids each backend made live in ``EXP/tracking.json``, so a resumed sweep continues
the same runs.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runners.results.records import (
    ExperimentRecord, TrialRecord, read_bounded, run_dir, write_json,
)

STATE = "tracking.json"
BACKENDS = ("mlflow", "tensorboard", "wandb")
MAX_RESULT = 8 << 20  # a trainer's result.json read for its training losses
MAX_CURVE = 2000  # training-loss points logged per replicate (every step up to this)
log = logging.getLogger("loopnas.track")


@dataclass
class Curve:
    """One replicate's training curve: eval metrics per rung, the training loss per step
    (from its ``result.json``, where the driver can read it) and its throughput."""

    evals: list[tuple[int, dict[str, float]]]
    losses: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_s: float | None = None
    steps: int | None = None


class Tracker(Protocol):
    """One backend. ``state`` is its part of ``EXP/tracking.json`` (run ids), saved after
    every call."""

    name: str
    state: dict

    def on_start(self, exp: ExperimentRecord, resumed: bool) -> None: ...

    def on_replicate(self, record: TrialRecord, index: int, curve: Curve) -> None: ...

    def on_candidate(self, record: TrialRecord) -> None: ...

    def on_end(self, front: list, report: Path | None) -> None: ...

    def close(self) -> None: ...


def curve(out: Path, record: TrialRecord, index: int) -> Curve:
    """The replicate's rungs, and its trainer's losses and tokens/s when its run directory
    is readable here (on a Ray cluster without a shared disk it is not: rungs only)."""
    rep = record.replicates[index]
    evals = [(r.step, {**r.metrics, **({"quality": r.quality} if r.quality is not None else {})})
             for r in rep.rungs]
    try:
        result = json.loads(read_bounded(run_dir(out, record, index) / "result.json", MAX_RESULT))
    except Exception:  # not here (another node's disk), or not a result: the rungs alone
        return Curve(evals)
    if not isinstance(result, dict):
        return Curve(evals)
    losses = [float(v) for v in result.get("losses") or []]
    stride = max(1, math.ceil(len(losses) / MAX_CURVE))
    seconds = (result.get("timings") or {}).get("steps") or result.get("wall_time")
    tokens = result.get("tokens")
    return Curve(evals, [(i + 1, v) for i, v in enumerate(losses) if (i + 1) % stride == 0 or i + 1 == len(losses)],
                 tokens / seconds if tokens and seconds else None, result.get("steps"))


def candidate_metrics(record: TrialRecord) -> dict[str, float]:
    """Every objective's mean and standard error (``acc``, ``acc_se``; ``acc@k2`` for an
    elastic trial's other loop counts) and the cost sheet's numbers (``cost/unique_params``)."""
    out: dict[str, float] = {}
    for p in record.points:
        at = "" if p.k is None or p is record.points[-1] else f"@k{p.k}"
        for name, value in p.values.items():
            out[name + at] = value
            if name in p.se:
                out[f"{name}_se{at}"] = p.se[name]
    for key, value in (record.cost or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"cost/{key}"] = float(value)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def candidate_tags(record: TrialRecord) -> dict[str, str]:
    tags = {"status": record.status, "trial": record.id, "node": record.node, "devices": ",".join(record.devices),
            "spec_hash": record.spec_hash, "duplicate_of": record.duplicate_of, "reason": record.reason}
    return {k: str(v)[:5000] for k, v in tags.items() if v}


def flat_params(params: dict[str, Any]) -> dict[str, str]:
    """Parameters as text (a choice may be a list or a mapping)."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}


def front_rows(front: list) -> list[dict]:
    """The front (``runners.results.front.FrontPoint``) as plain rows."""
    return [{"trial": p.trial, "k": p.k, "summary": p.summary, **p.values,
             **{f"{n}_se": se for n, se in p.se.items()}, "n": p.n, "p_front": p.p_front, "tied": p.tied}
            for p in front]


def _make(name: str, out: Path, options: dict, state: dict) -> Tracker:
    if name == "mlflow":
        from .mlflow_tracker import MlflowTracker
        return MlflowTracker(out, options, state)
    if name == "tensorboard":
        from .tensorboard_tracker import TensorboardTracker
        return TensorboardTracker(out, options, state)
    from .wandb_tracker import WandbTracker
    return WandbTracker(out, options, state)


class Tracking:
    """The fan-out: each call goes to every live backend; one that raises is one warning
    and is dropped for the rest of the sweep."""

    def __init__(self, out: Path | None = None, wanted: dict[str, dict] | None = None):
        self.out, self.backends, self.state = out, [], {}
        if not wanted:
            return
        self.path = Path(out) / STATE
        self.state = self._load()
        for name, options in wanted.items():
            try:
                self.backends.append(_make(name, Path(out), options, self.state.setdefault(name, {})))
            except Exception as exc:  # not installed, or it cannot start
                self._warn(name, "cannot start", exc)

    @property
    def active(self) -> bool:
        return bool(self.backends)

    def _load(self) -> dict:
        try:
            data = json.loads(read_bounded(self.path, 1 << 20))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _warn(self, name: str, what: str, exc: BaseException) -> None:
        why = " ".join(str(exc).split())[:300] or type(exc).__name__
        log.warning("warning: tracker %s %s (%s: %s); the sweep goes on without it", name, what,
                    type(exc).__name__, why)

    def _each(self, method: str, *args) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as exc:
                self._warn(backend.name, f"failed in {method}", exc)
                self.backends.remove(backend)
                try:
                    backend.close()
                except Exception:
                    pass
        if self.out is not None and self.state:
            try:
                write_json(self.path, self.state)
            except OSError as exc:
                self._warn("state", f"cannot write {self.path}", exc)

    def on_start(self, exp: ExperimentRecord, resumed: bool) -> None:
        self._each("on_start", exp, resumed)

    def on_replicate(self, record: TrialRecord, index: int) -> None:
        if self.backends:
            self._each("on_replicate", record, index, curve(self.out, record, index))

    def on_candidate(self, record: TrialRecord) -> None:
        self._each("on_candidate", record)

    def on_end(self, front: list, report: Path | None = None) -> None:
        self._each("on_end", front, report)

    def close(self) -> None:
        self._each("close")


def wanted(track, names: list[str] | None = None) -> dict[str, dict]:
    """The backends to log to: a space's ``search.track`` (``nas.space.TrackSpec``) and
    ``--track`` names, each with its settings."""
    out = {name: settings.model_dump(exclude_none=True) for name in BACKENDS
           if (settings := getattr(track, name, None)) is not None}
    for name in names or []:
        if name not in BACKENDS:
            raise ValueError(f"--track {name!r}: one of {', '.join(BACKENDS)}")
        out.setdefault(name, {})
    return out


def env_or(options: dict, key: str, env: str) -> str | None:
    return options.get(key) or os.environ.get(env) or None


__all__ = ["Tracker", "Tracking", "Curve", "curve", "candidate_metrics", "candidate_tags", "flat_params",
           "front_rows", "wanted", "BACKENDS", "STATE"]
