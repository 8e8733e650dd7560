"""The proxy trainer: an architecture and a config in, quality numbers out.

A :class:`Trainer` is one run, in the manner of torchtitan's ``Trainer`` and nanoGPT's short
loop: built from the spec and config (task, model, optimizer, fixed eval batches), then
:meth:`Trainer.fit` runs :meth:`~Trainer.train_step` (sample micro-batches, forward and
backward in :meth:`~Trainer.forward_backward_step`, where elastic depth splits each
micro-batch across loop counts; clip, step) until the budget is spent, evaluating on the
fixed eval batches (:meth:`~Trainer.evaluate`) and checkpointing (:meth:`~Trainer.state`,
a :class:`~runners.checkpoint.TrainState` that :mod:`runners.checkpoint` saves and loads).
A state-tracking curriculum moves to the next stage when eval accuracy reaches its
threshold and ends the run when a stage's step budget runs out. A non-finite loss ends the
run with a failed result, never an exception. :func:`train` is the entry point: it builds
a trainer, resumes it from a checkpoint if asked, and fits it.

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
import math
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import BaseModel, BeforeValidator, Field
from tqdm.auto import tqdm

from builders.model import build_model
from nas.elastic import before_switch
from nas.load import resolve
from nas.proxy import CurriculumConfig, TrainConfig
from nas.spec import ArchSpec, migrate_arch
from runners.checkpoint import (CHECKPOINT, RESULT, CurriculumState, RngState, TrainState, checkpoint_cap,
                                fingerprint, load_state, save_state, write_text)
from runners.elastic import (ElasticPoint, elastic_points, loop_groups, step_dist, switched_at, train_dist,
                             trained_loops)
from runners.tasks import Curriculum, Task, make_task

Callback = Callable[[int, dict[str, float]], "bool | None"]
_LOOP_SEED_SALT = 0x5EED_100B  # the loop-count sampler's stream differs from the data's
_SYNC_EVERY = 50  # losses stay on the device between evaluations, at most this many steps


class EvalRecord(BaseModel):
    step: int
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
    arch: Annotated[ArchSpec, BeforeValidator(migrate_arch)]  # result.json is a stored spec (nas.spec.stored_spec)


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


class Trainer:
    """One proxy run of ``arch`` on ``config.task``: built here (the task, the model, AdamW,
    the RNG streams, the fixed eval batches), optionally :meth:`resume`-d, then :meth:`fit`.

    ``callback(step, metrics)`` runs after every evaluation; returning False stops the run
    (status ``stopped``). ``out_dir`` receives ``checkpoint.pt`` (every ``checkpoint_every``
    steps and at the end) and ``result.json``.
    """

    def __init__(self, arch: ArchSpec, config: TrainConfig, out_dir: str | Path | None = None,
                 callback: Callback | None = None):
        self.start = time.perf_counter()
        self.arch = arch if arch.is_canonical else resolve(arch)
        self.config, self.callback = config, callback
        self.out = Path(out_dir) if out_dir is not None else None
        self.curriculum = (Curriculum(config.curriculum.stages, config.curriculum.threshold,
                                      metric=config.curriculum.metric)
                           if config.curriculum else None)
        task = (self.curriculum.task(**config.task_params) if self.curriculum
                else make_task(config.task, **config.task_params))
        self.proxy = with_vocab(self.arch, task.vocab_size)
        for params in config.extrapolate:  # fail now, not after training
            extrapolated(task, params)
        self.steps = total_steps(config, task)
        self.stage_budget = config.curriculum.stage_steps if self.curriculum else self.steps
        self.device = torch.device(config.device)
        self.cuda = self.device.type == "cuda"
        self.use_bf16 = self.cuda and config.dtype == "bfloat16"

        torch.manual_seed(config.seed)
        self.data_gen = torch.Generator().manual_seed(config.seed)
        self.loop_gen = torch.Generator().manual_seed(config.seed ^ _LOOP_SEED_SALT)
        self.model = build_model(self.proxy, backend=config.backend, device=self.device)
        initialise(self.model, self.proxy, config)
        self.conditioning = self.model.conditioning_parameters()
        self.optimizer = torch.optim.AdamW(param_groups(self.model, config.weight_decay), lr=config.lr,
                                           betas=config.betas, fused=self.cuda or None)
        self.forward = torch.compile(self.model) if config.compile and self.cuda else self.model
        self.step, self.stage_start, self.tokens, self.lr = 0, 0, 0, config.lr
        self.losses: list[float] = []
        self.evals: list[EvalRecord] = []
        self.depth_rows: dict[str, int] = {}
        self.pending: list[tuple[torch.Tensor, int, dict[str, int]]] = []  # (loss, tokens, depth_rows) not yet synced
        self.status: Literal["ok", "stopped", "failed"] = "ok"
        self.reason: str | None = None
        self.timings = dict.fromkeys(("build", "steps", "eval", "checkpoint", "callback"), 0.0)
        self._set_task(task)

    def _set_task(self, task: Task) -> None:
        """Train and evaluate on ``task`` (a curriculum stage), on its own fixed eval batches."""
        self.task, self.fixed_eval = task, eval_batches(task, self.config, self.device)

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.use_bf16 else contextlib.nullcontext()

    def trained_loops(self) -> int | None:
        """The loop count the model has trained at so far: 1 before an elastic switch."""
        return trained_loops(self.proxy, self.step, self.steps)

    def train_step(self) -> torch.Tensor:
        """One optimizer step: ``grad_accum`` micro-batches, each split into the loop counts
        its rows drew, then clip and step. Returns the step's mean loss, left on the device."""
        config, step = self.config, self.step
        self.lr = lr_at(step - self.stage_start, self.stage_budget, config)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        dist = step_dist(train_dist(self.proxy, step, self.steps), self.loop_gen)  # per: step draws once here
        self.model.start_step(self.loop_gen)  # random placement with sampling_per: step draws its pattern here
        for p in self.conditioning:  # ELR: conditioning enters at the switch, at exactly zero
            p.requires_grad_(not before_switch(self.proxy, step, self.steps))
        loss = torch.zeros((), device=self.device)
        for _ in range(config.grad_accum):
            x, y = (t.to(self.device, non_blocking=True) for t in self.task.batch(config.batch_size, self.data_gen))
            for loops, rows in loop_groups(dist, config.batch_size, self.loop_gen):
                loss += self.forward_backward_step(*((x, y) if rows is None else (x[rows], y[rows])), loops)
            self.tokens += x.numel()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss

    def forward_backward_step(self, x: torch.Tensor, y: torch.Tensor, loops: int | None) -> torch.Tensor:
        """Forward and backward on rows that run ``loops`` (None: the spec's T), weighted by
        their share of the step's rows; returns that share of the step's loss (detached)."""
        with self.autocast():
            loss = self.forward(x, y, loops=loops).loss
        scale = len(x) / (self.config.batch_size * self.config.grad_accum)
        (loss * scale).backward()
        depth = "T" if loops is None else str(loops)
        self.depth_rows[depth] = self.depth_rows.get(depth, 0) + len(x)
        return loss.detach() * scale

    def evaluate(self, loops: int | None = None) -> dict[str, float]:
        """Eval loss and task metrics on the fixed eval batches at ``loops`` (None: the
        spec's T); the weights, the model's mode and the training RNG are left as they were."""
        return evaluate(self.model, self.task, self.fixed_eval, self.autocast, eval_seed(self.config), loops)

    def sync(self) -> bool:
        """Copy the pending steps' losses to the host (the one sync with the device). A
        non-finite loss fails the run as it was when that loss was computed: False."""
        values = torch.stack([loss for loss, _, _ in self.pending]).tolist()
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is None:
            self.losses += values
            self.pending.clear()
            return True
        self.step -= len(self.pending) - bad
        self.tokens, self.depth_rows = self.pending[bad][1], self.pending[bad][2]
        self.losses += values[:bad]
        self.status, self.reason = "failed", f"non-finite training loss ({values[bad]}) at step {self.step + 1}"
        return False

    def record(self, metrics: dict[str, float]) -> None:
        """Keep an evaluation: the curriculum promotes on it (or ends the run when the
        stage's budget is spent), then the callback sees it."""
        curriculum = self.curriculum
        if curriculum:
            metrics["n"] = float(curriculum.n)
            promoted = curriculum.promote(metrics[curriculum.metric])
            if promoted and curriculum.done:
                self.status, self.reason = "ok", "every curriculum stage solved"
            elif promoted:
                self.stage_start = self.step
                self._set_task(curriculum.task(**self.config.task_params))
            elif self.step - self.stage_start >= self.stage_budget:
                self.status, self.reason = "ok", f"stage n={curriculum.n} unsolved within {self.stage_budget} steps"
        self.evals.append(EvalRecord(step=self.step, metrics=metrics))
        with _timed(self.timings, "callback"):
            if self.callback is not None and self.callback(self.step, metrics) is False:
                self.status, self.reason = "stopped", f"stopped by the callback at step {self.step}"

    def state(self) -> TrainState:
        """The run as its checkpoint holds it (the tensors are the live model's and optimizer's)."""
        curriculum = self.curriculum
        return TrainState(
            fingerprint=fingerprint(self.proxy, self.config), step=self.step,
            arch=self.arch.model_dump(mode="json"), config=self.config.model_dump(mode="json"),
            stage_start=self.stage_start, tokens=self.tokens, losses=list(self.losses),
            depth_rows=dict(self.depth_rows), evals=[e.model_dump() for e in self.evals],
            model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
            rng=RngState.capture(self.data_gen, self.loop_gen, self.cuda),
            curriculum=CurriculumState(curriculum.index, curriculum.stage_acc) if curriculum else None)

    def restore(self, state: TrainState) -> None:
        """Continue from ``state``, bit for bit (the fingerprint is :meth:`resume`'s check)."""
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        self.step, self.stage_start, self.tokens = state.step, state.stage_start, state.tokens
        self.losses, self.evals = list(state.losses), [EvalRecord(**e) for e in state.evals]
        self.depth_rows = dict(state.depth_rows)
        state.rng.restore(self.data_gen, self.loop_gen, self.cuda)
        if self.curriculum:
            self.curriculum.index = state.curriculum.index
            self.curriculum.stage_acc = state.curriculum.stage_acc
            self._set_task(self.curriculum.task(**self.config.task_params))

    def resume(self, path: str | Path) -> None:
        """Continue from the checkpoint at ``path``, which must be of this arch and config
        (the step or token budget may differ); it is read within the model's size cap."""
        state = load_state(path, cap=checkpoint_cap(self.proxy))
        if not state.matches(self.proxy, self.config):
            raise ValueError(f"{path} was written by a different arch or config")
        self.restore(state)

    def fit(self) -> TrainResult:
        """Train until the budget is spent, the curriculum ends, the callback stops the run
        or a loss is non-finite; then the result, written to ``out_dir`` if there is one."""
        config, every, out = self.config, self.config.checkpoint_every, self.out
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        self.timings["build"] = time.perf_counter() - self.start
        bar = tqdm(total=self.steps, initial=self.step, disable=not config.progress, desc=self.proxy.name, leave=False)
        self.model.train()
        while self.step < self.steps:
            with _timed(self.timings, "steps"):
                self.pending.append((self.train_step(), self.tokens, dict(self.depth_rows)))
                bar.update(1)
                since = self.step - self.stage_start
                evaluating = since % config.eval_every == 0 or since == self.stage_budget or self.step == self.steps
                saving = out is not None and every and self.step % every == 0
                if evaluating or saving or len(self.pending) >= _SYNC_EVERY:
                    if not self.sync():
                        break
                    bar.set_postfix(loss=f"{self.losses[-1]:.4f}", lr=f"{self.lr:.2e}")
            if evaluating:
                with _timed(self.timings, "eval"):
                    metrics = self.evaluate(self.trained_loops())
                self.record(metrics)
            if out is not None and every and (saving or self.reason is not None or self.step == self.steps):
                with _timed(self.timings, "checkpoint"):
                    save_state(out / CHECKPOINT, self.state())
            if self.reason is not None:
                break
        bar.close()
        result = self.result()
        if out is not None:
            write_text(out / RESULT, result.model_dump_json(indent=2))  # readers never see half a result
        return result

    def result(self) -> TrainResult:
        """The run's outcome: its last evaluation (made now if the run did not end on one),
        and, unless it failed, the elastic points and the extrapolations."""
        failed, curriculum, task = self.status == "failed", self.curriculum, self.task
        with _timed(self.timings, "eval"):
            final = self.evals[-1].metrics if self.evals and self.evals[-1].step == self.step else {}
            if not failed and not curriculum and not final:
                final = self.evaluate(self.trained_loops())
            metric = getattr(task, "quality_metric", "acc") if "acc" in final or curriculum else "eval_loss"
            switched = switched_at(self.proxy, self.step, self.steps)
            points = [] if failed or switched is None else elastic_points(self.proxy, self.evaluate, metric)
            extrapolation = [] if failed else [extrapolate(self.model, task, params, self.config, self.device,
                                                           self.autocast) for params in self.config.extrapolate]
        return TrainResult(
            status=self.status, reason=self.reason, task=self.config.task, steps=self.step, tokens=self.tokens,
            params=sum(p.numel() for p in self.model.parameters()),
            quality_metric="n_max" if curriculum else metric,
            higher_is_better=bool(curriculum) or metric != "eval_loss",
            quality=float(curriculum.n_max) if curriculum else final.get(metric), final=final,
            losses=self.losses, evals=self.evals, elastic=points, switch_step=switched,
            extrapolation=extrapolation, depth_rows=self.depth_rows,
            curriculum={**curriculum.summary(), "threshold": curriculum.threshold,
                        "stage_steps": self.stage_budget} if curriculum else None,
            vocab={"spec": self.arch.model.vocab_size, "task": task.vocab_size} if self.proxy is not self.arch else None,
            wall_time=time.perf_counter() - self.start, timings=self.timings, arch=self.proxy)


def train(arch: ArchSpec, config: TrainConfig, out_dir: str | Path | None = None,
          callback: Callback | None = None, resume: str | Path | None = None) -> TrainResult:
    """Train ``arch`` on ``config.task`` and evaluate it (a :class:`Trainer`'s run).

    ``callback(step, metrics)`` runs after every evaluation; returning False stops the
    run (status ``stopped``). ``out_dir`` receives ``checkpoint.pt`` (every
    ``checkpoint_every`` steps and at the end) and ``result.json``. ``resume``: a
    checkpoint of the same arch and config to continue from.
    """
    trainer = Trainer(arch, config, out_dir, callback)
    if resume is not None:
        trainer.resume(resume)
    return trainer.fit()


__all__ = ["CurriculumConfig", "TrainConfig", "TrainResult", "EvalRecord", "ElasticPoint",
           "ExtrapolationPoint", "Trainer", "TrainState", "extrapolate",
           "train", "with_vocab", "lr_at", "param_groups", "ffn_parameters", "evaluate"]
