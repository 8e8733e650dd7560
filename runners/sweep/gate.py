"""The gate every sampled candidate passes before it may train: lowered to its canonical
spec, priced, checked against the space's constraints and deduplicated by spec hash.

:func:`gate` decides and returns a :class:`Verdict`; it writes nothing and tells nothing (the
driver does, from the verdict). An invalid spec or a violated constraint is refused as
``infeasible`` and never reaches a worker; a canonical spec already trained or training
(same hash) is a duplicate of that candidate."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from nas.errors import SpecError
from nas.graph import summary
from nas.space import Space, cost_value, spec_hash, violations
from runners.results.records import TrialRecord
from runners.results.status import Status


@dataclass(frozen=True)
class Verdict:
    """What the gate made of a candidate."""

    record: TrialRecord  # priced where it lowered; ``infeasible`` with its reason where refused
    violated: tuple = ()  # (constraint, violation > 0 if violated): the trial's constraints
    sheets: dict = field(default_factory=dict)  # its cost sheets by context (priced again from them)
    config: dict[str, Any] | None = None  # its trainer settings, where it is to train
    duplicate_of: str | None = None  # the id of the identical candidate, settled or still training

    @property
    def refused(self) -> bool:
        return self.record.status == Status.INFEASIBLE


def _merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def trainer_config(space: Space, proxy: dict) -> dict:
    """A candidate's trainer settings: the space's proxy with the candidate's own over it,
    the eval batches of the sweep's seed, a checkpoint at every evaluation."""
    config = _merge(space.spec.proxy.trainer(), proxy)
    config.update(eval_seed=space.spec.search.seed, checkpoint_every=space.spec.proxy.eval_every)
    return config


def gate(space: Space, trial, record: TrialRecord, trained: Mapping[str, str]) -> Verdict:
    """The verdict on the candidate ``trial`` samples (``record``: its fresh record);
    ``trained``: spec hash → id of a candidate whose outcome an identical one would repeat
    (settled, or still training)."""
    try:
        arch, proxy, params = space.candidate(trial)
    except SpecError as exc:
        reason = "invalid spec: " + "; ".join(p.render(None) for p in exc.problems)
        return Verdict(record.model_copy(update={"params": dict(trial.params), "status": Status.INFEASIBLE.value,
                                                 "reason": reason}),
                       violated=tuple((c, 1.0) for c in space.constraints))
    h = spec_hash(arch, proxy)
    sheets: dict = {}
    bad = tuple(violations(space, arch, sheets))
    seq_len = space.spec.seq_len
    cost_value(arch, "unique_params", seq_len, sheets=sheets)  # the sheet at the space's context
    record = record.model_copy(update={
        "params": params, "spec_hash": h, "arch": arch.model_dump(mode="json"), "summary": summary(arch),
        "cost": sheets[seq_len].to_dict(),
        "violations": [f"{c.text} (is {cost_value(arch, c.metric, c.seq_len or seq_len, sheets=sheets):.4g})"
                       for c, v in bad if v > 0]})
    if record.violations:
        record = record.model_copy(update={"status": Status.INFEASIBLE.value, "reason": "; ".join(record.violations)})
        return Verdict(record, bad, sheets)
    if h in trained:
        return Verdict(record, bad, sheets, duplicate_of=trained[h])
    return Verdict(record, bad, sheets, config=trainer_config(space, proxy))


__all__ = ["Verdict", "gate", "trainer_config"]
