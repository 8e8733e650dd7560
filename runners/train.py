"""The proxy trainer: an architecture and a config in, quality numbers out.

:func:`train` is one top-to-bottom loop in the manner of nanoGPT's ``train.py``: build the
task and the model, then for every optimizer step sample micro-batches, run forward and
backward (elastic depth splits each micro-batch across loop counts), clip, step,
evaluate on fixed eval batches, checkpoint. A state-tracking curriculum moves to the next
stage when eval accuracy reaches its threshold and ends the run when a stage's step
budget runs out. A non-finite loss ends the run with a failed result, never an exception.

On CPU a run is deterministic: the same spec, config and seed give the same losses, and a
run resumed from a checkpoint continues bit for bit (torch's RNG, the data generator and
the loop-count sampler are all restored; evaluation runs under a forked RNG, so it never
perturbs training).

Losses stay on the device between host copies (at each evaluation and checkpoint, and at
least every ``_SYNC_EVERY`` steps), so a step never waits for the device; a non-finite
loss found at a copy ends the run as it stood when that loss was computed. One evaluation
loop, :func:`evaluate`, serves the trainer and the one-shot search (a fixed switch pattern).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from builders.model import build_model
from nas.elastic import before_switch, switch_step
from nas.load import resolve
from nas.proxy import CurriculumConfig, TrainConfig
from nas.spec import ArchSpec
from runners.checkpoint import CHECKPOINT, RESULT, checkpoint_cap, write_text
from runners.checkpoint import load as load_checkpoint
from runners.checkpoint import save as save_checkpoint
from runners.elastic import loop_groups, projection_compute, step_dist, train_dist
from runners.tasks import Curriculum, Task, make_task

Callback = Callable[[int, dict[str, float]], "bool | None"]
_LOOP_SEED_SALT = 0x5EED_100B  # the loop-count sampler's stream differs from the data's
_SYNC_EVERY = 50  # losses stay on the device between evaluations, at most this many steps


class EvalRecord(BaseModel):
    step: int
    metrics: dict[str, float]


class ElasticPoint(BaseModel):
    """One checkpoint evaluated at ``k`` loops: its quality and projection FLOPs per token."""

    k: int
    quality: float
    compute: float
    metrics: dict[str, float]


class ExtrapolationPoint(BaseModel):
    """The final model evaluated on the task with ``params`` overriding the trained ones."""

    params: dict[str, Any]
    seq_len: int
    metrics: dict[str, float]


class TrainResult(BaseModel):
    status: Literal["ok", "stopped", "failed"]
    reason: str | None = None
    task: str
    steps: int
    tokens: int
    params: int
    quality_metric: str
    higher_is_better: bool
    quality: float | None = None
    final: dict[str, float] = Field(default_factory=dict)
    losses: list[float] = Field(default_factory=list)
    evals: list[EvalRecord] = Field(default_factory=list)
    elastic: list[ElasticPoint] = Field(default_factory=list)
    switch_step: int | None = Field(None, description="first step of mixed-depth training (ELR's "
                                    "late switch); None when the run ended before it, and then "
                                    "no elastic points are reported")
    extrapolation: list[ExtrapolationPoint] = Field(default_factory=list)
    depth_rows: dict[str, int] = Field(default_factory=dict, description="training rows run at each "
                                       "loop count ('T': the spec's own)")
    curriculum: dict[str, Any] | None = None
    vocab: dict[str, int] | None = Field(None, description="{'spec': v, 'task': w} when the vocab "
                                         "was rewritten")
    wall_time: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict, description="seconds of this process's "
                                      "run in each phase: build (task, model, optimizer, eval batches), "
                                      "steps, eval, checkpoint, callback (a sweep's rung reports)")
    arch: ArchSpec


def with_vocab(arch: ArchSpec, vocab_size: int) -> ArchSpec:
    """The same architecture with the task's vocabulary (a pure spec → spec rewrite)."""
    if arch.model.vocab_size == vocab_size:
        return arch
    return arch.model_copy(update={"model": arch.model.model_copy(update={"vocab_size": vocab_size})})


def total_steps(config: TrainConfig, task: Task) -> int:
    if config.steps is not None:
        return config.steps
    if config.curriculum is not None:
        return config.curriculum.stage_steps * len(config.curriculum.stages)
    return math.ceil(config.tokens / (config.batch_size * config.grad_accum * task.seq_len))


def lr_at(step: int, total: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr`` at ``total``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.min_lr + (config.lr - config.min_lr) * cosine


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's rule: decay ≥2-D weights only. Never decay what fla marks
    ``_no_weight_decay`` (A_log, dt_bias, ...) nor the loop extras (ρ, gates, conditioning),
    which start at the identity and must be free to stay there. Frozen tensors are left
    out: the optimizer never touches them, weight decay included."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        extra = name == "rho" or name.startswith("loops.")
        skip = p.dim() < 2 or getattr(p, "_no_weight_decay", False) or extra
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def eval_seed(config: TrainConfig) -> int:
    """The seed of the eval batches and of evaluation's forked RNG."""
    return config.seed if config.eval_seed is None else config.eval_seed


def eval_batches(task: Task, config: TrainConfig, device: torch.device) -> list:
    """Fixed eval batches: the same for every evaluation of a run (and of its resumption)."""
    g = torch.Generator().manual_seed(eval_seed(config))
    return [tuple(t.to(device) for t in task.batch(config.batch_size, g, split="eval"))
            for _ in range(config.eval_batches)]


@torch.no_grad()
def evaluate(model, task: Task, batches: list, autocast: Callable = contextlib.nullcontext, seed: int = 0,
             loops: int | None = None, pattern: Sequence[int] | None = None) -> dict[str, float]:
    """Mean eval loss and task metrics over ``batches``, at ``loops`` (None: the spec's T).
    ``pattern``: every switch fixed to that option (a one-shot sub-network); None: the
    model's own forward (a random-placement model votes over sampled patterns). Runs under
    a forked, reseeded RNG, so it never perturbs training; the model's mode is restored."""
    was_training = model.training
    model.eval()
    devices = [batches[0][0].device] if batches[0][0].is_cuda else []
    sums: dict[str, float] = {}
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for x, y in batches:
            with autocast():
                if pattern is None:
                    out = model(x, y, loops=loops)
                    logits, ce = out.logits.float(), out.ce_loss
                else:
                    h, _ = model.hidden(x, loops=loops, pattern=list(pattern))
                    logits = model.head(h).float()
                    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
            for key, value in {"eval_loss": ce.item(), **task.metrics(logits, y)}.items():
                sums[key] = sums.get(key, 0.0) + value
    model.train(was_training)
    return {key: value / len(batches) for key, value in sums.items()}


def extrapolated(task: Task, params: dict[str, Any]) -> Task:
    """``task`` with ``params`` overriding its parameters, on the same vocabulary."""
    known = {f.name for f in dataclasses.fields(task)} if dataclasses.is_dataclass(task) else set()
    if not known or set(params) - known:
        raise ValueError(f"extrapolate {params}: task {task.name!r} has no parameter "
                         f"{sorted(set(params) - known) or list(params)}")
    longer = dataclasses.replace(task, **params)
    if longer.vocab_size != task.vocab_size:
        raise ValueError(f"extrapolate {params}: vocab {longer.vocab_size} differs from the "
                         f"trained {task.vocab_size}")
    return longer


def extrapolate(model, task: Task, params: dict[str, Any], config: TrainConfig,
                device: torch.device, autocast) -> ExtrapolationPoint:
    """Evaluate on ``task`` with ``params`` overriding its parameters (more steps, a longer
    sequence): the model must have been trained on the same vocabulary."""
    longer = extrapolated(task, params)
    batches = eval_batches(longer, config, device)
    return ExtrapolationPoint(params=params, seq_len=longer.seq_len,
                              metrics=evaluate(model, longer, batches, autocast, eval_seed(config)))


def ffn_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every FFN sublayer's weights and its pre-norm (``layers.{i}.ffn*``)."""
    return [p for name, p in model.named_parameters()
            if name.startswith("layers.") and name.split(".")[2] in ("ffn", "ffn_norm")]


def initialise(model: torch.nn.Module, arch: ArchSpec, config: TrainConfig) -> None:
    """``init_from``: copy the corresponding weights of a checkpoint; ``freeze_ffn``: stop
    gradients to the FFNs."""
    if config.init_from is not None:
        from runners.weights import inherit, load_source

        source, state = load_source(config.init_from)
        inherit(model, arch, state, source)
    for p in ffn_parameters(model) if config.freeze_ffn else ():
        p.requires_grad_(False)


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] += time.perf_counter() - start


def _fingerprint(arch: ArchSpec, config: TrainConfig) -> str:
    """What a checkpoint must match to be resumed. The progress bar may differ, and so may
    the step or token budget: a resumed run may be extended to more steps."""
    config_data = config.model_dump(mode="json", exclude={"progress", "steps", "tokens"})
    return json.dumps([arch.model_dump(mode="json"), config_data], sort_keys=True)


def _reread(fingerprint: str) -> str | None:
    """A checkpoint's fingerprint with its arch read through today's spec, so a value whose
    meaning is unchanged but whose spelling is (Mamba2's old written-out chunk 256) still
    matches; None when the arch no longer validates."""
    try:
        arch, config_data = json.loads(fingerprint)
        return json.dumps([ArchSpec.model_validate(arch).model_dump(mode="json"), config_data], sort_keys=True)
    except (ValueError, TypeError):
        return None


def train(arch: ArchSpec, config: TrainConfig, out_dir: str | Path | None = None,
          callback: Callback | None = None, resume: str | Path | None = None) -> TrainResult:
    """Train ``arch`` on ``config.task`` and evaluate it.

    ``callback(step, metrics)`` runs after every evaluation; returning False stops the
    run (status ``stopped``). ``out_dir`` receives ``checkpoint.pt`` (every
    ``checkpoint_every`` steps and at the end) and ``result.json``. ``resume``: a
    checkpoint of the same arch and config to continue from.
    """
    start = time.perf_counter()
    arch = arch if arch.is_canonical else resolve(arch)
    curriculum = (Curriculum(config.curriculum.stages, config.curriculum.threshold,
                             metric=config.curriculum.metric)
                  if config.curriculum else None)
    task = (curriculum.task(**config.task_params) if curriculum
            else make_task(config.task, **config.task_params))
    proxy = with_vocab(arch, task.vocab_size)
    for params in config.extrapolate:  # fail now, not after training
        extrapolated(task, params)
    steps = total_steps(config, task)
    stage_budget = config.curriculum.stage_steps if curriculum else steps
    device = torch.device(config.device)
    cuda = device.type == "cuda"

    torch.manual_seed(config.seed)
    data_gen = torch.Generator().manual_seed(config.seed)
    loop_gen = torch.Generator().manual_seed(config.seed ^ _LOOP_SEED_SALT)
    model = build_model(proxy, backend=config.backend, device=device)
    initialise(model, proxy, config)
    conditioning = model.conditioning_parameters()
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr,
                                  betas=config.betas, fused=cuda or None)
    step, stage_start, tokens = 0, 0, 0
    losses: list[float] = []
    evals: list[EvalRecord] = []
    depth_rows: dict[str, int] = {}
    if resume is not None:
        # on CPU, where RNG states live; load_state_dict moves the rest. Capped by the model's size
        ckpt = load_checkpoint(resume, cap=checkpoint_cap(proxy))
        if _reread(ckpt["fingerprint"]) != _fingerprint(proxy, config):
            raise ValueError(f"{resume} was written by a different arch or config")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, stage_start, tokens = ckpt["step"], ckpt["stage_start"], ckpt["tokens"]
        losses, evals = ckpt["losses"], [EvalRecord(**e) for e in ckpt["evals"]]
        depth_rows = ckpt["depth_rows"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        if cuda:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        data_gen.set_state(ckpt["rng"]["data"])
        loop_gen.set_state(ckpt["rng"]["loops"])
        if curriculum:
            curriculum.index = ckpt["curriculum"]["index"]
            curriculum.stage_acc = ckpt["curriculum"]["stage_acc"]
            task = curriculum.task(**config.task_params)
    fixed_eval = eval_batches(task, config, device)
    forward = torch.compile(model) if config.compile and cuda else model
    use_bf16 = cuda and config.dtype == "bfloat16"

    def trained_loops() -> int | None:
        """The loop count the model has trained at so far: 1 before an elastic switch."""
        return 1 if before_switch(proxy, step - 1, steps) else None

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()

    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    status, reason = "ok", None
    bar = tqdm(total=steps, initial=step, disable=not config.progress, desc=proxy.name, leave=False)
    pending: list[tuple[torch.Tensor, int, dict[str, int]]] = []  # (loss, tokens, depth_rows) of steps not yet synced
    timings = {"build": time.perf_counter() - start, "steps": 0.0, "eval": 0.0, "checkpoint": 0.0,
               "callback": 0.0}
    model.train()
    while step < steps:
        with _timed(timings, "steps"):
            lr = lr_at(step - stage_start, stage_budget, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            dist = step_dist(train_dist(proxy, step, steps), loop_gen)  # per: step draws once here
            model.start_step(loop_gen)  # random placement with sampling_per: step draws its pattern here
            for p in conditioning:  # ELR: conditioning enters at the switch, at exactly zero
                p.requires_grad_(not before_switch(proxy, step, steps))
            loss = torch.zeros((), device=device)
            for _ in range(config.grad_accum):
                x, y = (t.to(device, non_blocking=True) for t in task.batch(config.batch_size, data_gen))
                for loops, rows in loop_groups(dist, config.batch_size, loop_gen):
                    xs, ys = (x, y) if rows is None else (x[rows], y[rows])
                    with autocast():
                        micro = forward(xs, ys, loops=loops).loss
                    scale = len(xs) / (config.batch_size * config.grad_accum)
                    (micro * scale).backward()
                    loss += micro.detach() * scale
                    depth = "T" if loops is None else str(loops)
                    depth_rows[depth] = depth_rows.get(depth, 0) + len(xs)
                tokens += x.numel()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            pending.append((loss, tokens, dict(depth_rows)))
            bar.update(1)

            since = step - stage_start
            evaluating = since % config.eval_every == 0 or since == stage_budget or step == steps
            every = config.checkpoint_every
            saving = out is not None and every and step % every == 0
            if evaluating or saving or len(pending) >= _SYNC_EVERY:
                values = torch.stack([loss for loss, _, _ in pending]).tolist()  # the one host sync
                bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
                if bad is not None:  # the run ends as it was when that step's loss was computed
                    step -= len(pending) - bad
                    tokens, depth_rows = pending[bad][1], pending[bad][2]
                    losses += values[:bad]
                    status, reason = "failed", f"non-finite training loss ({values[bad]}) at step {step + 1}"
                    break
                losses += values
                pending.clear()
                bar.set_postfix(loss=f"{values[-1]:.4f}", lr=f"{lr:.2e}")

        if evaluating:
            with _timed(timings, "eval"):
                metrics = evaluate(model, task, fixed_eval, autocast, eval_seed(config), trained_loops())
            if curriculum:
                metrics["n"] = float(curriculum.n)
                promoted = curriculum.promote(metrics[curriculum.metric])
                if promoted and curriculum.done:
                    status, reason = "ok", "every curriculum stage solved"
                elif promoted:
                    task, stage_start = curriculum.task(**config.task_params), step
                    fixed_eval = eval_batches(task, config, device)
                elif since >= stage_budget:
                    status, reason = "ok", f"stage n={curriculum.n} unsolved within {stage_budget} steps"
            evals.append(EvalRecord(step=step, metrics=metrics))
            with _timed(timings, "callback"):
                if callback is not None and callback(step, metrics) is False:
                    status, reason = "stopped", f"stopped by the callback at step {step}"
        finished = reason is not None or step == steps
        if saving or out is not None and every and finished:
            with _timed(timings, "checkpoint"):
                save_checkpoint(out / CHECKPOINT, {
                    "fingerprint": _fingerprint(proxy, config), "step": step,
                    "arch": arch.model_dump(mode="json"), "config": config.model_dump(mode="json"),
                    "stage_start": stage_start, "tokens": tokens, "losses": losses,
                    "depth_rows": depth_rows, "evals": [e.model_dump() for e in evals],
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "rng": {"torch": torch.get_rng_state(),
                            "cuda": torch.cuda.get_rng_state_all() if cuda else None,
                            "data": data_gen.get_state(), "loops": loop_gen.get_state()},
                    "curriculum": ({"index": curriculum.index, "stage_acc": curriculum.stage_acc}
                                   if curriculum else None),
                })
        if reason is not None:
            break
    bar.close()

    with _timed(timings, "eval"):
        final = evals[-1].metrics if evals and evals[-1].step == step else {}
        if status != "failed" and not curriculum and not final:
            final = evaluate(model, task, fixed_eval, autocast, eval_seed(config), trained_loops())
        metric = getattr(task, "quality_metric", "acc") if "acc" in final or curriculum else "eval_loss"
        points = []
        switched = switch_step(proxy, steps) if proxy.elastic is not None else None
        switched = switched if switched is not None and step > switched else None
        if status != "failed" and switched is not None:
            for k in proxy.elastic.eval:
                m = evaluate(model, task, fixed_eval, autocast, eval_seed(config), loops=k)
                points.append(ElasticPoint(k=k, quality=m[metric], compute=projection_compute(proxy, k),
                                           metrics=m))
        extrapolation = ([] if status == "failed" else
                         [extrapolate(model, task, params, config, device, autocast)
                          for params in config.extrapolate])
    quality = float(curriculum.n_max) if curriculum else final.get(metric)
    result = TrainResult(
        status=status, reason=reason, task=config.task, steps=step, tokens=tokens,
        params=sum(p.numel() for p in model.parameters()),
        quality_metric="n_max" if curriculum else metric, higher_is_better=bool(curriculum) or metric != "eval_loss",
        quality=quality, final=final, losses=losses, evals=evals, elastic=points, switch_step=switched, extrapolation=extrapolation,
        depth_rows=depth_rows,
        curriculum={**curriculum.summary(), "threshold": curriculum.threshold,
                    "stage_steps": stage_budget} if curriculum else None,
        vocab={"spec": arch.model.vocab_size, "task": task.vocab_size} if proxy is not arch else None,
        wall_time=time.perf_counter() - start, timings=timings, arch=proxy,
    )
    if out is not None:
        write_text(out / RESULT, result.model_dump_json(indent=2))  # readers never see half a result
    return result


__all__ = ["CurriculumConfig", "TrainConfig", "TrainResult", "EvalRecord", "ElasticPoint",
           "ExtrapolationPoint", "extrapolate",
           "train", "with_vocab", "lr_at", "param_groups", "ffn_parameters", "evaluate",
           "save_checkpoint"]
