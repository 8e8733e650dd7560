"""The self-check of a one-shot sweep: does its ranking agree with stand-alone training?

After the search, :func:`nas.oneshot.spot_check` picks ``oneshot.check.n`` evaluated
sub-networks spread over the one-shot ranking (the one-shot front, the top and the bottom
always among them). They are trained stand-alone at the proxy's budget, ``check.seeds``
runs each (seeds ``search.seed + i``), as an ordinary experiment directory ``EXP/check/``:
a space whose one parameter, ``candidate``, names each one-shot trial and its spec hash
(``runners.transfer.plan.PlannedSpace``, the planned trials), run on the sweep's engine. So
the stand-alone trials are ordinary trials with the one-shot trials' parameters and spec
hashes: ``status``, ``report``, ``export`` and ``transfer`` read ``EXP/check`` as any sweep,
and the front a user exports can be the stand-alone one. :func:`nas.oneshot.agreement`
then compares the one-shot scores with the stand-alone replicate values; the result goes
into ``EXP/oneshot.json`` (``check``), which ``status`` and ``report`` show.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from nas import oneshot as one
from nas.space import ParamSpec, Space, SpaceSpec
from nas.spec import stored_spec
from runners.results.front import front
from runners.results.records import (
    EXPERIMENT, MAX_EXPERIMENT, Objective, TrialRecord, read_bounded, read_experiment, read_trials, write_json,
)
from runners.transfer.plan import CANDIDATE, Grown, PlannedSpace

from .search import SUMMARY
from .supernet import OneShotError

CHECK = "check"  # EXP/check: the stand-alone trials


def ranking(records: list[TrialRecord], quality: Objective) -> list[TrialRecord]:
    """The evaluated sub-networks, best one-shot score first (duplicates repeat their original)."""
    done = [r for r in records if r.status == "complete" and r.arch is not None
            and math.isfinite(r.values.get(quality.name, math.nan))]
    sign = -1.0 if quality.direction == "maximize" else 1.0
    return sorted(done, key=lambda r: (sign * r.values[quality.name], r.id))


def pick(records: list[TrialRecord], objectives: list[Objective], n: int) -> list[TrialRecord]:
    """The spot-check sample (:func:`nas.oneshot.spot_check`), in one-shot ranking order."""
    quality = next(o for o in objectives if o.quality)
    ranked = ranking(records, quality)
    on_front = {p.trial for p in front(records, objectives)}
    ids = one.spot_check([r.id for r in ranked], on_front, n)
    by_id = {r.id: r for r in ranked}
    return [by_id[i] for i in ids]


def check_space(space: Space, picked: list[TrialRecord]) -> PlannedSpace:
    """The ordinary space that trains ``picked`` stand-alone, at the proxy's budget."""
    plan = tuple(Grown(r.id, stored_spec(r.arch), {}, dict(r.params)) for r in picked)
    spec = space.spec
    search = spec.search.model_copy(update={"trials": len(plan), "storage": None, "early_stopping": None})
    spec = spec.model_copy(update={
        "name": f"{spec.name}-check"[:64], "base": None, "match": None, "constraints": (), "oneshot": None,
        "description": f"the self-check of one-shot sweep {spec.name}: {len(plan)} of its sub-networks "
                       "trained stand-alone",
        "params": {CANDIDATE: ParamSpec(choices=tuple(g.choice for g in plan))}, "search": search})
    return PlannedSpace(SpaceSpec.model_validate(spec.model_dump()), space.source, None, (), None, plan)


def _resumable(space: PlannedSpace, out: Path) -> bool:
    """Whether ``out`` holds this self-check already (resume it); other candidates there are
    one clear error."""
    if not (out / EXPERIMENT).is_file():
        return False
    if read_experiment(out).space != space.spec.model_dump(mode="json"):
        raise OneShotError(f"{out} holds a self-check of other sub-networks; move it away to check this "
                           "sweep again")
    return True


def measure(picked: list[TrialRecord], trained: list[TrialRecord], quality: Objective, seeds: int,
            ranked: list[str]) -> dict:
    """The self-check's result from the one-shot trials ``picked`` and their stand-alone
    trials ``trained`` (matched by spec hash; one without all ``seeds`` runs is left out)."""
    by_hash = {r.spec_hash: r for r in trained if r.status == "complete"}
    rows, scores, values, missing = [], [], [], []
    for r in picked:
        twin = by_hash.get(r.spec_hash)
        reps = sorted((x for x in (twin.replicates if twin else []) if x.status == "complete" and x.points),
                      key=lambda x: x.seed)
        if len(reps) < seeds:
            missing.append(r.id)
            continue
        per_seed = [x.points[-1].values[quality.name] for x in reps[:seeds]]
        scores.append(r.values[quality.name])
        values.append(per_seed)
        mean, se = twin.points[-1].values[quality.name], twin.points[-1].se.get(quality.name)
        rows.append({"trial": r.id, "standalone_trial": twin.id, "oneshot_rank": ranked.index(r.id) + 1,
                     "summary": r.summary, "params": r.params, "oneshot": scores[-1], "mean": mean, "se": se,
                     "values": per_seed, "seeds": [x.seed for x in reps[:seeds]]})
    result = one.agreement(scores, values).to_dict()
    if missing:
        result["verdict"] += (f" ({len(missing)} of the sample left out: no complete stand-alone run at every "
                              f"seed for {', '.join(missing)})")
    return {**result, "metric": quality.name, "direction": quality.direction, "dir": CHECK,
            "ranked": len(ranked), "candidates": rows, "missing": missing}


def skipped(why: str) -> dict:
    """A self-check that did not run, with why (the same keys as a result)."""
    return {"tau": None, "tau_ci": [None, None], "p": None, "n": 0, "seeds": 0, "agrees": None,
            "verdict": f"not checked ({why}): nothing says whether this one-shot ranking agrees with "
                       "stand-alone training; this front says where to look, not what is best",
            "skipped": why}


def _summary(path: Path) -> dict:
    """The one-shot search's summary (EXP/oneshot.json), read bounded (issue #34): {} when
    there is none or it is not a summary (a FIFO, a device, a torn or oversized file)."""
    try:
        data = json.loads(read_bounded(path, MAX_EXPERIMENT)) if os.path.lexists(path) else {}
    except (OSError, ValueError, RecursionError):  # Skipped is a ValueError
        return {}
    return data if isinstance(data, dict) else {}


def run_check(space: Space, records: list[TrialRecord], objectives: list[Objective], out: Path,
              engine: str = "optuna", address: str | None = None, progress: bool = True) -> dict:
    """Train the spot-check sample stand-alone in ``out/check`` (resumed when there) on
    ``engine``, compare, and write the result into ``out/oneshot.json`` (``check``)."""
    from runners.sweep.run import run_sweep

    settings = one.check_settings(space.spec.oneshot.check)
    summary = _summary(out / SUMMARY)
    if settings is None:
        result = skipped("oneshot.check is false")
    elif isinstance(summary.get("search"), dict) and summary["search"].get("budget_spent"):
        result = skipped("the search stopped at its trial budget; resume the sweep to finish and check it")
    else:
        quality = next(o for o in objectives if o.quality)
        picked = pick(records, objectives, settings.n)
        planned = check_space(space, picked)
        where = out / CHECK
        run_sweep(planned, out=where, engine=engine, resume=_resumable(planned, where), address=address,
                  progress=progress, seeds=settings.seeds, planned=planned.planned())
        result = measure(picked, read_trials(where), quality, settings.seeds,
                         [r.id for r in ranking(records, quality)])
    write_json(out / SUMMARY, {**summary, "check": result})
    return result


__all__ = ["CHECK", "check_space", "measure", "pick", "ranking", "run_check", "skipped"]
