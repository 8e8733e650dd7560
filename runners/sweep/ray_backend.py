"""The ``ray`` backend: Ray Tune schedules trials on a local Ray instance or a cluster.

- Sampling: the driver asks its one Optuna study, gates the candidate and tells the study
  the outcome (:meth:`.driver.Sweep.next_job`), as on the ``optuna`` backend; Ray only
  schedules. :class:`GateSearcher` is a Tune searcher that hands Tune the driver's next
  job, so infeasible and duplicate candidates never become Ray trials. Ray's own
  ``OptunaSearch`` is not used: it keeps a second study on the same storage, asks it for
  every Tune trial, and would tell a stopped trial COMPLETE with its truncated values,
  which corrupts the front.
- Early stopping: :class:`ParetoScheduler` asks the driver at every rung.
- Records: :class:`RecordCallback` hands rungs and outcomes to the driver, which writes
  the experiment directory (on the driver's machine, whatever node trained the trial).
- Devices: Ray places trials on GPUs from ``resources`` (:func:`.devices.ray_resources`:
  fractional GPUs, a whole one for a job rerun alone after an out-of-memory error, the
  ``accelerator_type``) and sets each actor's ``CUDA_VISIBLE_DEVICES``, which the trial
  reads as on the local backend.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Callable

from .devices import FallbackNotice, ray_resources
from .driver import Sweep
from .job import Job
from .records import Rung


def _quiet_env() -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file, no warning (Ray 2.60)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


from ray.tune import Callback  # noqa: E402  (this module itself is imported lazily)
from ray.tune.schedulers import FIFOScheduler, TrialScheduler  # noqa: E402
from ray.tune.search import Searcher  # noqa: E402

# Tune pickles its config (searcher, scheduler, callbacks) into the run directory; the
# sweep holds storage locks and files, so the components reach it through this table.
_LIVE: dict[int, tuple[Sweep, Callable[[], None], FallbackNotice]] = {}


class _Live:
    _key: int

    @property
    def sweep(self) -> Sweep:
        return _LIVE[self._key][0]

    def changed(self) -> None:
        _LIVE[self._key][1]()

    @property
    def notice(self) -> FallbackNotice:
        return _LIVE[self._key][2]

    def __getstate__(self) -> dict:
        return {"_key": self._key}


class GateSearcher(_Live, Searcher):
    def __init__(self, key: int):
        Searcher.__init__(self, metric=None, mode=None)
        self._key = key

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        sweep = self.sweep
        job = sweep.next_job()  # a queued replicate first, else a newly asked and gated candidate
        self.changed()
        if job is not None:
            return {"job": job.model_dump()}  # Tune's trial config: plain data
        # a running candidate may still queue a rerun (out of memory): not finished yet
        return Searcher.FINISHED if not sweep.wants_more() and not sweep.active else None

    def on_trial_complete(self, trial_id, result=None, error=False) -> None:
        pass  # RecordCallback tells the study

    def save_to_dir(self, *args, **kwargs) -> None:
        pass  # the study and the records are the state; --resume rebuilds from them

    def restore_from_dir(self, *args, **kwargs) -> None:
        pass


class ParetoScheduler(_Live, FIFOScheduler):
    def __init__(self, key: int):
        FIFOScheduler.__init__(self)
        self._key = key

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def on_trial_result(self, tune_controller, trial, result):
        if "rung" not in result:
            return TrialScheduler.CONTINUE
        job = _job(trial)
        rid = job.id
        if self.sweep.on_rung(rid, Rung.model_validate_json(result["rung"])):
            return TrialScheduler.CONTINUE
        started = self.sweep.records[job.trial].started or time.time()
        self.sweep.finish(rid, {"status": "pruned", "reason": f"stopped early at step {result['step']}",
                                "node": result.get("node"), "devices": [d for d in result.get("devices", "").split(",") if d],
                                "wall_time": time.time() - started})
        self.changed()
        return TrialScheduler.STOP


class RecordCallback(_Live, Callback):
    def __init__(self, key: int):
        self._key = key

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "outcome" in result:
            outcome = json.loads(result["outcome"])
            self.notice.seen(outcome)
            self.sweep.finish(_job(trial).id, outcome)
            self.changed()

    def on_trial_error(self, iteration, trials, trial, **info):
        self.sweep.finish(_job(trial).id, {
            "status": "failed", "crashed": True,
            "reason": f"the trial's Ray actor died: {_error(trial)}"})
        self.changed()


def _job(trial) -> Job:
    return Job.model_validate(trial.config["job"])


def _error(trial) -> str:
    try:
        err = trial.get_error()
    except Exception:  # the error file may be gone or unreadable
        err = None
    return (str(err).strip().splitlines() or ["see the Ray logs"])[-1][:300] if err else "see the Ray logs"


def _request(resources, config: dict):
    """The placement group of one trial: its job's resources (a rerun alone asks more)."""
    from ray.tune import PlacementGroupFactory

    wanted = ray_resources(resources, Job.model_validate(config["job"]).alone)
    cpu, gpu = wanted.pop("cpu"), wanted.pop("gpu")
    return PlacementGroupFactory([{"CPU": cpu, "GPU": gpu, **wanted}])


def run_ray(sweep: Sweep, address: str | None = None, on_change: Callable[[], None] = lambda: None) -> None:
    """Run the sweep on Ray Tune; starts a local Ray instance unless ``address`` is given
    (``auto`` or ``host:port`` joins an existing cluster)."""
    _quiet_env()
    import ray
    from ray import tune

    from .trial import ray_trainable

    search = sweep.space.spec.search
    started = not ray.is_initialized()
    if started:
        local = {} if address else {"num_cpus": max(1, int(search.concurrency * search.resources.cpu))}
        ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False, configure_logging=False, **local)
    key = id(sweep)
    _LIVE[key] = (sweep, on_change, FallbackNotice())
    searcher, scheduler, callback = GateSearcher(key), ParetoScheduler(key), RecordCallback(key)
    resources = functools.partial(_request, search.resources)
    tuner = tune.Tuner(
        tune.with_resources(ray_trainable, resources),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=-1,
                                    max_concurrent_trials=search.concurrency, reuse_actors=True),
        run_config=tune.RunConfig(name="ray", storage_path=str((sweep.out / "ray").resolve()), verbose=0,
                                  callbacks=[callback], failure_config=tune.FailureConfig(max_failures=0)))
    try:
        tuner.fit()
    except BaseException:
        sweep.interrupted()
        raise
    finally:
        _LIVE.pop(key, None)
        if started:
            ray.shutdown()
    if sweep.active:  # Ctrl-C makes fit() return early: leave those trials to --resume
        sweep.interrupted()


__all__ = ["run_ray"]
