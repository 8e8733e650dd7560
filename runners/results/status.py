"""One status for the whole project: a trial's (a candidate's) and a replicate's, the order
they are shown in, which ones end a trial, and the one mapping to Optuna's ``TrialState``."""
from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator


class Status(StrEnum):
    """What became of a trial or one of its replicates. A ``StrEnum``: records keep the plain
    word (``"complete"``), and a member equals its word."""

    QUEUED = "queued"  # a replicate not yet started (never a trial's status)
    RUNNING = "running"
    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"
    TIMEOUT = "timeout"
    OOM = "oom"
    INFEASIBLE = "infeasible"  # refused by the gate: over a budget or a constraint (trials only)
    DUPLICATE = "duplicate"  # the same spec as an earlier trial, whose outcome it shares (trials only)


#: the order counts are shown in (status, the progress line, the report): every trial status
SHOWN = (Status.COMPLETE, Status.RUNNING, Status.PRUNED, Status.FAILED, Status.TIMEOUT, Status.OOM,
         Status.INFEASIBLE, Status.DUPLICATE)
#: a trial's status once it has ended (``infeasible`` too where the budget counts it)
FINAL = (Status.COMPLETE, Status.PRUNED, Status.FAILED, Status.TIMEOUT, Status.OOM, Status.DUPLICATE)
#: a run that ended without a result: the ones a user is told to look at
FAILURES = (Status.FAILED, Status.TIMEOUT, Status.OOM)
#: how a run ends: what a worker's outcome says (``runners.sweep.outcome``)
ENDED = (Status.COMPLETE, Status.PRUNED, Status.FAILED, Status.TIMEOUT, Status.OOM)
#: what a replicate can be (a run of its own: never infeasible or a duplicate)
REPLICATE = (Status.QUEUED, Status.RUNNING, Status.COMPLETE, Status.PRUNED, Status.FAILED, Status.TIMEOUT,
             Status.OOM)


def _one_of(*allowed: Status):
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)} (got {value!r})")
        return str(value)  # the plain word: records are read and written as text
    return check


#: a trial's status as a record field: a plain string, one of ``SHOWN``
TrialStatus = Annotated[str, AfterValidator(_one_of(*SHOWN))]
#: a replicate's status as a record field: one of ``REPLICATE``
ReplicateStatus = Annotated[str, AfterValidator(_one_of(*REPLICATE))]
#: a run's outcome: one of ``ENDED``
EndedStatus = Annotated[str, AfterValidator(_one_of(*ENDED))]


def optuna_state(status: str):
    """The Optuna ``TrialState`` a trial of this status is told as: complete (with values)
    for a complete one, pruned for a pruned or infeasible one (values instead where the
    driver tells a constraint-aware sampler the infeasible region), fail otherwise (a trial
    still running is not told)."""
    from optuna.trial import TrialState

    status = Status(status)
    if status is Status.COMPLETE:
        return TrialState.COMPLETE
    if status in (Status.PRUNED, Status.INFEASIBLE):
        return TrialState.PRUNED
    return TrialState.FAIL  # failed, timeout, oom; a duplicate is told as its original was


__all__ = ["Status", "TrialStatus", "ReplicateStatus", "EndedStatus", "SHOWN", "FINAL", "FAILURES", "ENDED",
           "REPLICATE", "optuna_state"]
