"""The experiment directory: what a sweep writes and what `status`, `report` and `export` read.

Layout (every file written atomically, as it happens)::

    EXP/
      experiment.json         ExperimentRecord: the space, objectives, backend, settings
      space.yaml              the space file as the user wrote it
      study.journal           the Optuna study (JournalStorage): optuna-dashboard opens it
      trials/t0007.json       one TrialRecord per trial (any status, updated as it runs)
      trials/t0007/           per-trial scratch: checkpoint.pt, result.json of the trainer

Reading needs pydantic only (no torch, no ray), so `status` and `report` start instantly
and work on a sweep that is still running.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["running", "complete", "pruned", "infeasible", "duplicate", "failed", "timeout", "oom"]
Direction = Literal["minimize", "maximize"]
EXPERIMENT = "experiment.json"
TRIALS = "trials"


class _Record(BaseModel):
    # a diverged metric is written as NaN, not null, so the record still reads back
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="constants")


class Objective(_Record):
    """One objective: a quality metric measured by the proxy (``acc``, ``eval_loss``,
    ``n_max``), a serving cost measured on the trained model (``decode_latency_ms``,
    ``peak_memory_bytes``, ...: ``nas.space.SERVING_METRICS``) or a cost-model quantity
    known before training (``projection_flops``, ``unique_params``, ``kv_bytes``, ...)."""

    name: str
    direction: Direction
    measured: bool = Field(description="True for a proxy or serving metric, False for a cost-model value")
    serving: bool = Field(False, description="a measured serving cost (experiments written before "
                                             "serving objectives have none)")

    @property
    def quality(self) -> bool:
        """The proxy's quality metric: measured, not a serving cost."""
        return self.measured and not self.serving

    @property
    def metric(self) -> str:
        """The metric's name without the context it is priced at (``kv_bytes@4096``)."""
        return self.name.split("@", 1)[0]


class Rung(_Record):
    """One evaluation of a running trial: at ``step`` optimizer steps, its metrics."""

    step: int
    tokens: int = 0
    quality: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class Point(_Record):
    """One (quality, cost) point a trial contributes to the front: ``k`` is the loop count
    an elastic checkpoint was evaluated at (None: the spec's own loops). ``values`` holds
    every objective by name: a trial's point is the mean over its replicates, ``se`` each
    objective's standard error over them (0 for cost-model objectives; NaN with one
    replicate: noise unknown) and ``n`` how many replicates it averages."""

    k: int | None = None
    values: dict[str, float]
    se: dict[str, float] = Field(default_factory=dict)
    n: int = 1


class Replicate(_Record):
    """One seed of a candidate: its own training run (initialisation and data order), on
    the eval batches every replicate and candidate share."""

    index: int
    seed: int
    status: Literal["queued", "running", "complete", "pruned", "failed", "timeout", "oom"] = "queued"
    reason: str | None = None
    rungs: list[Rung] = Field(default_factory=list)
    points: list[Point] = Field(default_factory=list)
    crashed: bool = False
    node: str | None = None
    devices: list[str] = Field(default_factory=list, description="the GPU ids it was given (its "
                               "CUDA_VISIBLE_DEVICES), or ['cpu']; runners.sweep.devices")
    ran_on: Literal["cuda", "cpu"] | None = Field(None, description="where the model trained: 'cpu' for "
                                                  "a GPU job in a process without CUDA")
    peak_memory: int | None = Field(None, description="the CUDA allocator's peak bytes (None on CPU)")
    retried: str | None = Field(None, description="why it was rerun alone on a whole device: the "
                                "out-of-memory error it met while sharing one (search.on_oom)")
    started: float | None = None
    finished: float | None = None
    wall_time: float | None = None


class TrialRecord(_Record):
    id: str
    number: int
    status: Status
    reason: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str | None = None
    arch: dict[str, Any] | None = Field(None, description="the canonical spec (model_dump)")
    summary: str | None = Field(None, description="one line: what the architecture is")
    cost: dict[str, Any] | None = Field(None, description="CostSheet.to_dict() at the space's seq_len")
    points: list[Point] = Field(default_factory=list)
    rungs: list[Rung] = Field(default_factory=list)
    duplicate_of: str | None = None
    violations: list[str] = Field(default_factory=list)
    seed: int = 0
    replicates: list[Replicate] = Field(default_factory=list, description="one per seed; "
                                        "points and rungs above are their means")
    crashed: bool = Field(False, description="a failure of the process (killed, native crash), "
                          "not of the candidate: a later identical candidate is trained again")
    node: str | None = Field(None, description="the host that trained it")
    devices: list[str] = Field(default_factory=list, description="the devices its replicates were given "
                               "(GPU ids, or 'cpu')")
    peak_memory: int | None = Field(None, description="the largest CUDA peak of its replicates, bytes")
    started: float | None = None
    finished: float | None = None
    wall_time: float | None = None

    @property
    def values(self) -> dict[str, float]:
        """The objectives at the spec's own loop count (the last point for elastic trials)."""
        return self.points[-1].values if self.points else {}


class ExperimentRecord(_Record):
    name: str
    space: dict[str, Any]
    objectives: list[Objective]
    backend: str
    trials: int
    seed: int = 0
    seeds: int = Field(1, description="replicates per candidate")
    created: float
    seq_len: int = Field(description="context the cost sheets and kv_bytes are priced at")


def write_json(path: Path, data: BaseModel | dict) -> None:
    """Write atomically: readers see the old file or the new one, never half of either."""
    text = data.model_dump_json(indent=2) if isinstance(data, BaseModel) else json.dumps(data, indent=2)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def trial_path(exp_dir: Path, trial_id: str) -> Path:
    return Path(exp_dir) / TRIALS / f"{trial_id}.json"


def read_experiment(exp_dir: str | Path) -> ExperimentRecord:
    path = Path(exp_dir) / EXPERIMENT
    if not path.is_file():
        raise FileNotFoundError(f"{exp_dir} is not an experiment directory (no {EXPERIMENT})")
    return ExperimentRecord.model_validate_json(path.read_text())


def read_trials(exp_dir: str | Path) -> list[TrialRecord]:
    """Every trial record, by trial number."""
    folder = Path(exp_dir) / TRIALS
    records = [TrialRecord.model_validate_json(p.read_text()) for p in folder.glob("t*.json")]
    return sorted(records, key=lambda r: r.number)


__all__ = ["Status", "Direction", "Objective", "Rung", "Point", "Replicate", "TrialRecord", "ExperimentRecord",
           "write_json", "trial_path", "read_experiment", "read_trials", "EXPERIMENT", "TRIALS"]
