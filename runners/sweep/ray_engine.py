"""The ``ray`` engine: Ray Tune schedules trials on a local Ray instance or a cluster.

- Sampling: the driver asks its one Optuna study, gates the candidate and tells the study
  the outcome (:meth:`.driver.Sweep.next_job`), as on the ``optuna`` engine; Ray only
  schedules. :class:`GateSearcher` is a Tune searcher that hands Tune the driver's next
  job, so infeasible and duplicate candidates never become Ray trials. Ray's own
  ``OptunaSearch`` is not used: it keeps a second study on the same storage, asks it for
  every Tune trial, and would tell a stopped trial COMPLETE with its truncated values,
  which corrupts the front.
- Early stopping: :class:`ParetoScheduler` asks the driver at every rung.
- Records: :class:`RecordCallback` hands rungs and outcomes (:class:`.outcome.Outcome`, sent
  as JSON) to the driver, which writes the experiment directory (on the driver's machine,
  whatever node trained the trial).
- Devices: Ray places trials on GPUs from ``resources`` (:func:`.devices.ray_resources`:
  fractional GPUs, a whole one for a job rerun alone after an out-of-memory error, the
  ``accelerator_type``) and sets each actor's ``CUDA_VISIBLE_DEVICES``, which the trial
  reads as on the local engine.
"""
from __future__ import annotations

import functools
import logging
import os
import socket
import time
from typing import Callable

from nas.errors import LoopnasError

from runners.results.records import Rung

from .devices import FallbackNotice, ray_resources
from .driver import Sweep
from .job import Job
from .outcome import Outcome


TIMEOUT_ENV = "LOOPNAS_RAY_CONNECT_TIMEOUT"
CONNECT_TIMEOUT = 10.0  # seconds for a cluster's head to answer (TIMEOUT_ENV overrides)
START = "start a cluster with  ray start --head  and give the address it prints (or auto on its node)"
# an HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, the Ray
# Client server) answers with a SETTINGS frame of its own
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


class RayAddressError(LoopnasError):
    """``--address`` names no Ray cluster that answers: one line, exit code 2."""


def connect_timeout() -> float:
    """The seconds a cluster's head has to answer: :data:`TIMEOUT_ENV`, else :data:`CONNECT_TIMEOUT`."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, CONNECT_TIMEOUT))
    except ValueError:
        raise RayAddressError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]}: not a number of seconds") from None
    return value if 0 < value < 3600 else CONNECT_TIMEOUT


def _probe(host: str, port: int, timeout: float) -> str:
    """Why nothing at ``host:port`` answers as a gRPC server within ``timeout`` s, or ''."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(_PREFACE)
            head = b""
            while len(head) < 9:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except ConnectionRefusedError:
        return "connection refused: nothing listens there"
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if len(head) < 9 or head[3] != 4:  # the frame type of SETTINGS
        return "something answers there, but not a Ray head (gRPC): the dashboard's port?"
    return ""


def check_address(address: str | None, timeout: float | None = None) -> None:
    """Refuse in one line, within ``timeout`` seconds (:func:`connect_timeout`), an
    ``--address`` where no Ray cluster answers: empty, a URL, not ``host:port``, or a port
    where nothing answers as Ray's head does. ``auto`` is resolved as Ray resolves it."""
    if address is None:
        return
    timeout = connect_timeout() if timeout is None else timeout
    text = address.strip()
    if not text:
        raise RayAddressError(f"--address is empty; {START}")
    if "://" in text and not text.startswith("ray://"):
        raise RayAddressError(f"--address {address}: a URL is not a Ray address (the head's host:port, "
                              f"port 6379 unless ray start --port said otherwise); {START}")
    target = text
    if text == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address
            target = canonicalize_bootstrap_address("auto")
        except Exception:  # Ray says it in several ways: none found, several found
            target = None
        if not target:
            raise RayAddressError(f"--address auto: no running Ray cluster found on this machine; {START}")
    host, sep, port = target.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayAddressError(f"--address {address}: not host:port; {START}")
    why = _probe(host.strip("[]"), int(port), timeout)
    if why:
        where = "" if target == text else f" ({target})"
        raise RayAddressError(f"--address {address}{where}: no Ray cluster: {why}; {START}")


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
        pass  # RecordCallback hands the outcome to the driver, which tells the study

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
        self.sweep.on_outcome(rid, Outcome(
            status="pruned", reason=f"stopped early at step {result['step']}", node=result.get("node"),
            devices=tuple(d for d in result.get("devices", "").split(",") if d), wall_time=time.time() - started))
        self.changed()
        return TrialScheduler.STOP


class RecordCallback(_Live, Callback):
    def __init__(self, key: int):
        self._key = key

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "outcome" in result:
            outcome = Outcome.model_validate_json(result["outcome"])
            self.notice.seen(outcome)
            self.sweep.on_outcome(_job(trial).id, outcome)
            self.changed()

    def on_trial_error(self, iteration, trials, trial, **info):
        self.sweep.on_outcome(_job(trial).id, Outcome(
            status="failed", crashed=True, reason=f"the trial's Ray actor died: {_error(trial)}"))
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


def _init(ray, address: str | None, num_cpus: int) -> None:
    """Start a local Ray instance, or join the cluster at ``address`` (which passed
    :func:`check_address`): a cluster that answers the probe and still refuses is one line."""
    quiet = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                 configure_logging=False)
    if address is None:
        ray.init(**quiet, num_cpus=num_cpus)
        return
    os.environ.setdefault("RAY_NUM_REDIS_GET_RETRIES", str(max(1, round(connect_timeout()))))  # ~1 s each
    try:
        ray.init(address=address.strip(), **quiet)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        raise RayAddressError(f"--address {address}: cannot join the Ray cluster there ({last}); {START}") from None


def run_ray(sweep: Sweep, address: str | None = None, on_change: Callable[[], None] = lambda: None) -> None:
    """Run the sweep on Ray Tune; starts a local Ray instance unless ``address`` is given
    (``auto`` or ``host:port`` joins an existing cluster)."""
    search = sweep.space.spec.search
    ray_resources(search.resources)  # a share Ray cannot schedule: one line, before Ray starts
    check_address(address)  # a cluster that does not answer: one line, before Ray starts
    _quiet_env()
    import ray
    from ray import tune

    from .trial import ray_trainable

    started = not ray.is_initialized()
    if started:
        _init(ray, address, max(1, int(search.concurrency * search.resources.cpu)))
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


__all__ = ["CONNECT_TIMEOUT", "RayAddressError", "TIMEOUT_ENV", "check_address", "connect_timeout", "run_ray"]
