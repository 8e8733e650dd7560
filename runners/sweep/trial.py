"""One trial, wherever it runs (a Ray actor or a local worker process): train the proxy,
report each rung, measure its serving objectives on the trained model, and return an
outcome. A trial never raises: an exception, a NaN, an out-of-memory error or the time
limit each become an outcome with a reason."""
from __future__ import annotations

import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .records import Rung

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


def run_trial(job: dict[str, Any], report: Report) -> dict[str, Any]:
    """Train ``job['arch']`` with ``job['config']``; ``job['metric']`` names the quality
    objective, ``job['serving']`` the serving objectives (``name``, ``metric``,
    ``seq_len``, ``batch_size``; measured after training), ``job['timeout']`` the time
    limit in seconds (checked at every evaluation)."""
    start = time.time()
    outcome: dict[str, Any] = {"status": "failed", "reason": None, "rungs": [], "measured": [],
                               "started": start, "node": job.get("node") or socket.gethostname()}
    try:
        _set_threads()
        outcome.update(_train(job, report, start))
    except Exception as exc:  # recorded, never raised: the sweep goes on
        outcome["reason"] = _reason(exc)
        outcome["traceback"] = traceback.format_exc(limit=8)
    outcome["finished"] = time.time()
    outcome["wall_time"] = outcome["finished"] - start
    return outcome


def _reason(exc: BaseException) -> str:
    import torch
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or exc.title}: {e['msg']}" for e in exc.errors())
        return f"invalid {exc.title} settings: {errors}"[:400]
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return f"out of memory: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _train(job: dict[str, Any], report: Report, start: float) -> dict[str, Any]:
    from nas.spec import ArchSpec
    from runners.train import CHECKPOINT, TrainConfig, train

    arch = ArchSpec.model_validate(job["arch"])
    config = TrainConfig.model_validate({**job["config"], "progress": False})
    metric, timeout = job["metric"], job.get("timeout")
    out_dir = Path(job["dir"])
    resume = out_dir / CHECKPOINT if job.get("resume") and (out_dir / CHECKPOINT).is_file() else None
    rungs: list[dict] = []
    stop: dict[str, str] = {}

    def callback(step: int, metrics: dict[str, float]) -> bool:
        rung = Rung(step=step, quality=quality_of(metrics, metric), metrics=metrics)
        rungs.append(rung.model_dump())
        if not report(rung):
            stop.update(status="pruned", reason=f"stopped early at step {step}")
            return False
        if timeout is not None and time.time() - start > timeout:
            stop.update(status="timeout", reason=f"time limit {timeout:g} s reached at step {step}")
            return False
        return True

    result = train(arch, config, out_dir=out_dir, callback=callback, resume=resume)
    if result.status == "failed":
        return {"status": "failed", "reason": result.reason, "rungs": rungs}
    if result.status == "stopped":
        return {"status": stop.get("status", "pruned"), "reason": stop.get("reason"), "rungs": rungs}
    measured = [{"k": None, "value": quality_of(result.final, metric, result), "metrics": result.final}]
    measured += [{"k": p.k, "value": quality_of(p.metrics, metric), "metrics": p.metrics}
                 for p in result.elastic]
    if any(m["value"] is None for m in measured):
        known = ", ".join(sorted(result.final)) or "none"
        return {"status": "failed", "rungs": rungs,
                "reason": f"the proxy reports no metric {metric!r}; it reports: {known}"}
    if job.get("serving"):
        try:
            _measure_serving(job["serving"], result.arch, config, out_dir / CHECKPOINT, measured)
        except Exception as exc:  # the proxy trained; its serving measurement did not run
            return {"status": "failed", "rungs": rungs, "reason": f"serving measurement: {_reason(exc)}"}
    return {"status": "complete", "reason": result.reason, "rungs": rungs, "measured": measured,
            "steps": result.steps, "tokens": result.tokens}


def _measure_serving(objectives: list[dict], arch, config, checkpoint: Path, measured: list[dict]) -> None:
    """Each point's serving objectives, measured on the trained weights at its loop count
    (an elastic trial: at each evaluated k), in the serving dtype (bf16 where the trainer
    ran under bf16 autocast)."""
    import torch

    from builders.model import build_model
    from runners.bench.measure import for_serving
    from runners.bench.serving import serving_values
    from runners.checkpoint import load

    device = torch.device(config.device)
    dtype = torch.bfloat16 if device.type == "cuda" and config.dtype == "bfloat16" else torch.float32
    model = build_model(arch, backend=config.backend, device=device)
    model.load_state_dict(load(checkpoint)["model"])
    served, _ = for_serving(model, dtype)
    elastic = [m for m in measured if m["k"] is not None]
    for m in elastic or measured:
        m["serving"] = serving_values(served, objectives, loops=m["k"], dtype=dtype, train_model=model)


def ray_trainable(config: dict[str, Any]) -> None:
    """Ray Tune's function trainable: one job; every rung and the outcome go through
    ``tune.report``. Early stopping is the scheduler's (it stops the actor)."""
    import ray
    from ray import tune

    job = {**config["job"], "node": ray.get_runtime_context().get_node_id()}

    def report(rung: Rung) -> bool:
        tune.report({"rung": rung.model_dump_json(), "step": rung.step, "node": job["node"],
                     "quality": rung.quality if rung.quality is not None else float("nan")})
        return True

    import json

    outcome = run_trial(job, report)
    tune.report({"outcome": json.dumps(outcome), "done": True})


__all__ = ["run_trial", "ray_trainable", "quality_of"]
