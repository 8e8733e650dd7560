"""What became of one replicate job: the answer a worker process or a Ray actor gives the
driver, as :class:`.job.Job` is the question.

Pure data, like the job. It crosses the process and Ray boundary as ``model_dump()`` (Ray:
``model_dump_json()``) and is read back with ``Outcome.model_validate``, so a field one side
adds and the other does not know fails at once, by name. The trainer's result is mapped to
it once (:func:`runners.sweep.trial.run_trial`); the driver maps it to the replicate's
record once (:func:`runners.sweep.recorder.replicate_fields`)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runners.results.records import Rung
from runners.results.status import EndedStatus

_DATA = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class Measured(BaseModel):
    """The trained model's quality at one loop count (``k``; None: the spec's own), its eval
    metrics, and its serving objectives by name where the job asked for some."""

    model_config = _DATA

    k: int | None = None
    value: float | None = None  # the job's quality metric
    metrics: dict[str, float] = Field(default_factory=dict)
    serving: dict[str, float] = Field(default_factory=dict)


class Outcome(BaseModel):
    model_config = _DATA

    status: EndedStatus  # complete, pruned, failed, timeout or oom
    reason: str | None = None
    rungs: tuple[Rung, ...] = ()  # every evaluation the run reported
    measured: tuple[Measured, ...] = ()  # a complete run's: the spec's own, then each elastic k
    crashed: bool = False  # the process failed (killed, native crash), not the candidate
    started: float | None = None
    finished: float | None = None
    wall_time: float | None = None
    node: str | None = None
    devices: tuple[str, ...] = ()  # the GPU ids it was given, or ("cpu",); empty: not known
    share: float | None = None  # of each device (None: no GPU)
    ran_on: Literal["cuda", "cpu"] | None = None
    fallback: str | None = None  # why a job that asked for a GPU trained on CPU
    peak_memory: int | None = None  # the CUDA allocator's peak bytes
    steps: int | None = None
    tokens: int | None = None
    traceback: str | None = None

    @classmethod
    def of(cls, data: Outcome | dict[str, Any]) -> Outcome:
        """``data`` as an outcome: one as it is, plain data validated."""
        return data if isinstance(data, cls) else cls.model_validate(data)


__all__ = ["Outcome", "Measured"]
