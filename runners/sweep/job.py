"""The job of one replicate: what the driver hands a worker process or a Ray actor to train.

Pure data. It crosses the process and Ray boundary as ``model_dump()`` and is read back with
``Job.model_validate``, so a field that one side adds and the other does not know fails at
once, by name, instead of being ignored."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ServingJob(BaseModel):
    """A serving objective the trial measures on its trained model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    metric: str
    seq_len: int
    batch_size: int


class Job(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str  # the replicate's: the trial's id, or ``<trial>-s<index>`` with several seeds
    trial: str
    replicate: int
    arch: dict[str, Any]  # an ArchSpec as JSON
    config: dict[str, Any]  # trainer settings, validated as a TrainConfig by the trial
    dir: str
    metric: str  # the quality objective's metric
    serving: tuple[ServingJob, ...] = ()
    timeout: float | None = None  # seconds, checked at every evaluation
    resume: bool = False  # continue from the checkpoint in ``dir`` when there is one
    alone: bool = False  # rerun on a whole device after running out of memory beside others
    gpu: float = 0.0  # resources.gpu: what the job asked for
    share: float | None = None  # of each of its devices (None: no GPU)
    memory_cap: bool = True  # cap CUDA memory at ``share``
    node: str | None = None  # the Ray node that runs it


__all__ = ["Job", "ServingJob"]
