"""One trial, wherever it runs (a Ray actor or a local worker process): train the proxy,
report each rung, measure its serving objectives on the trained model, and return an
:class:`.outcome.Outcome`. A trial never raises: an exception, a NaN, an out-of-memory error
or the time limit each become an outcome with a reason.

Devices (:mod:`runners.sweep.devices`): a job that asks for a GPU (``job.gpu`` > 0)
trains on ``cuda`` when CUDA is available in this process, which sees only the devices its
``CUDA_VISIBLE_DEVICES`` names, else on CPU (the outcome's ``fallback`` says why); with a
share below one device (``job.share``) and ``job.memory_cap`` its CUDA memory is capped
at that share. A CUDA out-of-memory error is the outcome ``oom``, with the allocator's peak.

Test hook: ``LOOPNAS_TEST_OOM=t0001,t0004`` (trial ids) makes those trials raise
``torch.cuda.OutOfMemoryError`` at their first evaluation while they share a device (a
share below 1), as a trial that outgrows its share does; alone on a whole device they run
normally. ``t0002:always`` raises alone too. It exists so that CPU tests drive the real
out-of-memory path (trial, worker, driver, records) end to end."""
from __future__ import annotations

import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from nas.errors import SpecError, from_validation_error
from runners.results.records import Rung
from runners.results.status import Status

from . import devices
from .job import Job, ServingJob
from .outcome import Measured, Outcome

TEST_OOM = "LOOPNAS_TEST_OOM"

# report(rung) → True to go on, False to stop here (early stopping).
Report = Callable[[Rung], bool]


def quality_of(metrics: dict[str, float], metric: str, result=None) -> float | None:
    """The measured objective: a metric name, or ``quality``/``n_max`` (the trainer's)."""
    if metric in metrics:
        return float(metrics[metric])
    if result is not None and metric in ("quality", result.quality_metric):
        return result.quality
    return None


def _set_threads() -> None:
    """Ray sets OMP_NUM_THREADS per trial, but torch reads it once per process."""
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)


def run_trial(job: Job, report: Report) -> Outcome:
    """Train ``job.arch`` with ``job.config``; ``job.metric`` names the quality objective,
    ``job.serving`` the serving objectives (measured after training), ``job.timeout`` the
    time limit in seconds (checked at every evaluation)."""
    start = time.time()
    fields: dict[str, Any] = {"status": Status.FAILED, "started": start, "node": job.node or socket.gethostname(),
                              "devices": [devices.CPU], "share": job.share}
    cuda = False
    try:
        _set_threads()
        device, fields["fallback"] = _place(job)
        cuda = device.startswith("cuda")
        if job.gpu or cuda:
            fields["devices"] = devices.visible()
        fields["ran_on"] = "cuda" if cuda else "cpu"
        fields.update(_train(job, report, start, device))
    except Exception as exc:  # recorded, never raised: the sweep goes on
        fields.update(status=Status.OOM if _is_oom(exc) else Status.FAILED, reason=_reason(exc),
                      traceback=traceback.format_exc(limit=8))
    if cuda:
        fields["peak_memory"] = _peak_and_free()
    fields["finished"] = time.time()
    fields["wall_time"] = fields["finished"] - start
    return Outcome.model_validate(fields)

def _place(job: Job) -> tuple[str, str | None]:
    """The torch device of this job and, when it asked for a GPU and got the CPU, why.
    A GPU job's device is ``cuda`` (the first visible device); its memory cap and peak
    counters are set here, as a reused worker's previous job left them."""
    import torch

    if not job.gpu:
        return job.config.get("device", "cpu"), None
    if not torch.cuda.is_available():
        where = os.environ.get(devices.ENV)
        seen = f"{devices.ENV}={where}" if where is not None else "no GPU visible"
        return "cpu", f"CUDA is not available in the trial's process ({seen})"
    share = job.share or 1.0
    cap = share if job.memory_cap and share < 1 else 1.0
    for i in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(cap, i)
        torch.cuda.reset_peak_memory_stats(i)
    return "cuda", None


def _peak_and_free() -> int:
    """The CUDA allocator's peak over this job's devices; frees the cache for the next job."""
    import gc

    import torch

    peak = max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
    gc.collect()
    torch.cuda.empty_cache()
    return int(peak)


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def _test_oom(job: Job) -> bool:
    """The test hook of the module docstring: this trial is named and shares a device."""
    named = dict((t.strip().split(":") + [""])[:2] for t in os.environ.get(TEST_OOM, "").split(","))
    when = named.get(job.trial)
    return when == "always" or when == "" and (job.share or 1.0) < 1


def _reason(exc: BaseException) -> str:
    import torch

    if isinstance(exc, SpecError):  # the job's spec or settings, validated by _valid
        return f"invalid {exc.source} settings: {'; '.join(p.render(None) for p in exc.problems)}"[:400]
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return f"out of memory: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _valid(model, data: dict):
    """``data`` as ``model``; an invalid one is a :class:`SpecError` in the project's words."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, model).with_source(model.__name__) from None


def _ended(result, stop: dict[str, str]) -> dict[str, Any]:
    """How a training run ended, as outcome fields: the one mapping of the trainer's result
    (its status ``ok``, ``stopped`` or ``failed``) to an outcome's status and reason. A run
    the callback stopped was pruned or ran out of time (``stop`` says which)."""
    if result.status == "failed":
        return {"status": Status.FAILED, "reason": result.reason}
    if result.status == "stopped":
        return {"status": stop.get("status", Status.PRUNED), "reason": stop.get("reason")}
    return {"status": Status.COMPLETE, "reason": result.reason, "steps": result.steps, "tokens": result.tokens}


def _train(job: Job, report: Report, start: float, device: str) -> dict[str, Any]:
    import torch

    from nas.spec import ArchSpec
    from runners.train import CHECKPOINT, TrainConfig, train

    arch = _valid(ArchSpec, job.arch)
    config = _valid(TrainConfig, {**job.config, "progress": False, "device": device})
    metric, timeout = job.metric, job.timeout
    out_dir = Path(job.dir)
    resume = out_dir / CHECKPOINT if job.resume and (out_dir / CHECKPOINT).is_file() else None
    rungs: list[Rung] = []
    stop: dict[str, str] = {}

    def callback(step: int, metrics: dict[str, float]) -> bool:
        if _test_oom(job):
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory ({TEST_OOM}): {job.id} outgrew its "
                                              f"share {job.share} of device {os.environ.get(devices.ENV)}")
        rung = Rung(step=step, quality=quality_of(metrics, metric), metrics=metrics)
        rungs.append(rung)
        if not report(rung):
            stop.update(status=Status.PRUNED, reason=f"stopped early at step {step}")
            return False
        if timeout is not None and time.time() - start > timeout:
            stop.update(status=Status.TIMEOUT, reason=f"time limit {timeout:g} s reached at step {step}")
            return False
        return True

    result = train(arch, config, out_dir=out_dir, callback=callback, resume=resume)
    ended = {**_ended(result, stop), "rungs": rungs}
    if ended["status"] != Status.COMPLETE:
        return ended
    measured = [Measured(value=quality_of(result.final, metric, result), metrics=result.final)]
    measured += [Measured(k=p.k, value=quality_of(p.metrics, metric), metrics=p.metrics) for p in result.elastic]
    if any(m.value is None for m in measured):
        known = ", ".join(sorted(result.final)) or "none"
        return {"status": Status.FAILED, "rungs": rungs,
                "reason": f"the proxy reports no metric {metric!r}; it reports: {known}"}
    if job.serving:
        try:
            measured = _measure_serving(job.serving, result.arch, config, out_dir / CHECKPOINT, measured)
        except Exception as exc:  # the proxy trained; its serving measurement did not run
            return {"status": Status.OOM if _is_oom(exc) else Status.FAILED, "rungs": rungs,
                    "reason": f"serving measurement: {_reason(exc)}"}
    return {**ended, "measured": measured}


def _measure_serving(objectives: tuple[ServingJob, ...], arch, config, checkpoint: Path,
                     measured: list[Measured]) -> list[Measured]:
    """Each point's serving objectives, measured on the trained weights at its loop count
    (an elastic trial: at each evaluated k), in the serving dtype (bf16 where the trainer
    ran under bf16 autocast)."""
    import torch

    from builders.model import build_model
    from runners.bench.measure import for_serving
    from runners.bench.serving import serving_values
    from runners.checkpoint import checkpoint_cap, load

    device = torch.device(config.device)
    dtype = torch.bfloat16 if device.type == "cuda" and config.dtype == "bfloat16" else torch.float32
    model = build_model(arch, backend=config.backend, device=device)
    model.load_state_dict(load(checkpoint, cap=checkpoint_cap(arch))["model"])
    served, _ = for_serving(model, dtype)
    elastic = any(m.k is not None for m in measured)
    wanted = [o.model_dump() for o in objectives]
    return [m.model_copy(update={"serving": serving_values(served, wanted, loops=m.k, dtype=dtype,
                                                           train_model=model)})
            if m.k is not None or not elastic else m for m in measured]


def ray_trainable(config: dict[str, Any]) -> None:
    """Ray Tune's function trainable: one job; every rung and the outcome go through
    ``tune.report``. Early stopping is the scheduler's (it stops the actor)."""
    import ray
    from ray import tune

    job = Job.model_validate({**config["job"], "node": ray.get_runtime_context().get_node_id()})
    given = ",".join(devices.visible())  # Ray set CUDA_VISIBLE_DEVICES for this actor

    def report(rung: Rung) -> bool:
        tune.report({"rung": rung.model_dump_json(), "step": rung.step, "node": job.node, "devices": given,
                     "quality": rung.quality if rung.quality is not None else float("nan")})
        return True

    outcome = run_trial(job, report)
    tune.report({"outcome": outcome.model_dump_json(), "done": True})


__all__ = ["run_trial", "ray_trainable", "quality_of"]
