"""The remedies of a one-shot ranking that disagrees with stand-alone training
(``oneshot.remedy``, :class:`nas.oneshot.OneShotRemedySpec`).

Three change how the supernet trains, so a space with any of them trains it here, in one
loop in the manner of the proxy trainer (warmup and cosine lr, AdamW, clipping; the
elastic loop counts drawn per row and a fresh placement per forward pass, as
``runners.train`` does), instead of in ``runners.train``:

- ``per_loop_gates``: :class:`LoopGates` holds a ρ table per loop count; a forward pass at
  ``T`` runs the model with that table in place of its own (``torch.func.functional_call``),
  so the gates of T = 1 are never the first row of those of T = 3;
- ``sandwich`` (BigNAS): every step trains the largest loop count on the labels, then the
  smallest and ``random`` sampled ones, on the largest's detached predictions with
  ``distill`` (:func:`distill_loss`);
- ``few_shot``: the supernet trains ``warm`` of the steps, then is copied (weights, gates,
  optimizer state, data stream) into one supernet per option of layer 0, each trained the
  remaining steps with layer 0 fixed to its option.

:class:`Supernets` is the result: the model a sub-network is scored with (its branch, its
loop count's gates). The fourth remedy, ``finetune``, acts at scoring time:
:func:`finetune` trains an extracted sub-network a few steps before it is scored.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from builders.model import LoopLM, build_model
from builders.sampling import sample_pattern
from nas import oneshot as one
from nas.elastic import train_dist
from nas.proxy import TrainConfig
from nas.space import Space
from nas.spec import ArchSpec
from runners.checkpoint import RESULT, checkpoint_cap, load, save, write_text
from runners.elastic import loop_groups, step_dist
from runners.tasks import Task, make_task
from runners.train import eval_batches, evaluate, initialise, lr_at, param_groups, total_steps, with_vocab

from .supernet import supernet_config

WEIGHTS = "remedied.pt"  # the trained supernet(s) and their gates, beside result.json
_SALT = 0x5EED_0A5E  # the pattern and loop-count stream differs from the data's


class LoopGates(nn.Module):
    """A residual-gate table per loop count: for every ρ tensor of the model (the shared
    ``rho``, a region's ``loops.{r}.rho``) and every ``T`` of ``loops``, a (T, d) table,
    started from the model's first T rows (zero at initialisation)."""

    def __init__(self, model: LoopLM, loops: Sequence[int]):
        super().__init__()
        self.names = [n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] == "rho"]
        self.loops = tuple(loops)
        self.tables = nn.ParameterDict({
            self.key(n, T): nn.Parameter(model.get_parameter(n).detach()[:T].clone())
            for n in self.names for T in self.loops})

    @staticmethod
    def key(name: str, T: int) -> str:
        return f"{name.replace('.', '_')}_T{T}"

    def at(self, T: int) -> dict[str, torch.Tensor]:
        """The tables a forward pass at ``T`` runs with, by the model's parameter names."""
        return {n: self.tables[self.key(n, T)] for n in self.names}

    @torch.no_grad()
    def load_into(self, model: LoopLM, T: int) -> None:
        """Write the tables of ``T`` into ``model``'s own ρ (rows from T on: zero, unused at T)."""
        for n, table in self.at(T).items():
            rho = model.get_parameter(n)
            rho.zero_()
            rho[:T].copy_(table)


@dataclass
class Supernets:
    """Trained supernet weights: ``models[b]`` is branch ``b``'s supernet (few-shot: the
    option of layer 0; None: the one supernet), ``gates[b]`` its per-loop gates or None."""

    net: ArchSpec
    models: dict[int | None, LoopLM]
    gates: dict[int | None, LoopGates | None]
    _scoring: dict = field(default_factory=dict, repr=False)

    def branch(self, pattern: Sequence[int]) -> int | None:
        return None if None in self.models else pattern[0]

    def model_for(self, pattern: Sequence[int], loops: int | None) -> LoopLM:
        """The model that scores sub-network (``pattern``, ``loops``): its branch's supernet,
        with the gates of ``loops`` in place of its own ρ (a copy, made once)."""
        b = self.branch(pattern)
        gates = self.gates[b]
        if gates is None:
            return self.models[b]
        key = (b, loops)
        if key not in self._scoring:
            model = copy.deepcopy(self.models[b])
            gates.load_into(model, loops)
            self._scoring[key] = model.eval()
        return self._scoring[key]


@dataclass
class _State:
    """What one supernet's training carries from step to step (and a few-shot branch forks)."""

    model: LoopLM
    gates: LoopGates | None
    optimizer: torch.optim.Optimizer
    data_gen: torch.Generator
    draw_gen: torch.Generator
    losses: list[float] = field(default_factory=list)

    def fork(self) -> "_State":
        model, gates, optimizer = copy.deepcopy((self.model, self.gates, self.optimizer))
        gens = []
        for g in (self.data_gen, self.draw_gen):
            gens.append(torch.Generator(device=g.device))
            gens[-1].set_state(g.get_state())
        return _State(model, gates, optimizer, *gens, list(self.losses))


def draw_pattern(net: ArchSpec, gen: torch.Generator, branch: int | None = None) -> list[int]:
    """A placement as the supernet's sampler draws it; with ``branch``, conditioned on
    layer 0 running that option (rejection: exact, and cheap, since every option of
    layer 0 has probability ≥ 1/L)."""
    while True:
        pattern = sample_pattern(net, len(net.layers), gen)
        if branch is None or pattern[0] == branch:
            return pattern


def _forward(model: LoopLM, gates: LoopGates | None, x: torch.Tensor, pattern: Sequence[int],
             loops: int | None):
    """Training forward pass of one sub-network: its logits and auxiliary loss."""
    params = gates.at(loops) if gates is not None else {}
    with model.hold_pattern(pattern):
        out = functional_call(model, params, (x,), {"loops": loops})
    return out.logits, out.aux_loss


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-100)


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """In-place distillation (BigNAS): KL(teacher ‖ student) over the labelled positions,
    the teacher's logits detached (no gradient reaches the largest sub-network through it)."""
    keep = y != -100
    s = F.log_softmax(student[keep].float(), dim=-1)
    t = F.log_softmax(teacher.detach()[keep].float(), dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def sandwich_draws(loops: Sequence[int], n_random: int, gen: torch.Generator) -> list[tuple[int, str]]:
    """(loop count, role) of one sandwich step: the largest, the smallest, then
    ``n_random`` counts drawn uniformly."""
    picks = torch.randint(len(loops), (n_random,), generator=gen).tolist()
    return [(max(loops), "largest"), (min(loops), "smallest"), *[(loops[i], "random") for i in picks]]


def _sandwich_step(s: _State, net: ArchSpec, remedy, x, y, loops, branch, scale: float) -> float:
    """One micro-batch of a sandwich step (backward included); returns the largest's loss."""
    teacher, first = None, 0.0
    for k, role in sandwich_draws(loops, remedy.sandwich.random, s.draw_gen):
        logits, aux = _forward(s.model, s.gates, x, draw_pattern(net, s.draw_gen, branch), k)
        if role == "largest":
            loss = _ce(logits, y)
            teacher, first = logits.detach(), loss.item()
        else:
            loss = distill_loss(logits, teacher, y) if remedy.sandwich.distill else _ce(logits, y)
        (((loss + aux) if aux is not None else loss) * scale).backward()
    return first


def _elastic_step(s: _State, net: ArchSpec, dist, x, y, branch, scale: float) -> float:
    """One micro-batch as the proxy trainer runs a supernet: rows grouped by their drawn
    loop count, a fresh placement for each group's forward pass."""
    total = 0.0
    for k, rows in loop_groups(dist, len(x), s.draw_gen):
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        logits, aux = _forward(s.model, s.gates, xs, draw_pattern(net, s.draw_gen, branch), k)
        loss = _ce(logits, ys) + (aux if aux is not None else 0.0)
        (loss * scale * len(xs) / len(x)).backward()
        total += loss.item() * len(xs) / len(x)
    return total


def _fit(s: _State, net: ArchSpec, config: TrainConfig, task: Task, remedy, loops, steps: range,
         total: int, branch: int | None = None) -> _State:
    """Train ``s`` over ``steps`` of a ``total``-step schedule (layer 0 fixed to ``branch``)."""
    device = torch.device(config.device)
    params = [p for group in s.optimizer.param_groups for p in group["params"]]
    s.model.train()
    for step in steps:
        for group in s.optimizer.param_groups:
            group["lr"] = lr_at(step, total, config)
        dist = step_dist(train_dist(net, step, total), s.draw_gen)
        loss, scale = 0.0, 1.0 / config.grad_accum
        for _ in range(config.grad_accum):
            x, y = (t.to(device) for t in task.batch(config.batch_size, s.data_gen))
            if remedy.sandwich is not None:
                loss += scale * _sandwich_step(s, net, remedy, x, y, loops, branch, scale)
            else:
                loss += scale * _elastic_step(s, net, dist, x, y, branch, scale)
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        s.losses.append(loss)
    return s


def _start(net: ArchSpec, config: TrainConfig, loops, per_loop_gates: bool) -> _State:
    torch.manual_seed(config.seed)
    model = build_model(net, backend=config.backend, device=config.device)
    initialise(model, net, config)
    gates = LoopGates(model, loops).to(config.device) if per_loop_gates else None
    groups = param_groups(model, config.weight_decay)
    if gates is not None:
        gated = {id(model.get_parameter(n)) for n in gates.names}  # replaced at every forward pass
        groups = [{**g, "params": [p for p in g["params"] if id(p) not in gated]} for g in groups]
        groups.append({"params": list(gates.parameters()), "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)
    return _State(model, gates, optimizer, torch.Generator().manual_seed(config.seed),
                  torch.Generator().manual_seed(config.seed ^ _SALT))


def _fingerprint(net: ArchSpec, config: TrainConfig, remedy) -> str:
    return json.dumps([net.model_dump(mode="json"), config.model_dump(mode="json", exclude={"progress"}),
                       remedy.model_dump(mode="json")], sort_keys=True)


def _result(path: Path) -> dict | None:
    """A finished remedied run's result.json, read bounded (issue #34); None, with one
    warning, when it is not one (torn, oversized, a FIFO or a device): trained again."""
    import logging

    from runners.results.records import read_bounded

    try:
        data = json.loads(read_bounded(path))
    except (OSError, ValueError, RecursionError) as exc:  # Skipped is a ValueError
        logging.getLogger("loopnas.records").warning("warning: %s: unreadable (%s); trained again", path, exc)
        return None
    return data if isinstance(data, dict) else None


def train_remedied(space: Space, out: Path) -> tuple[dict, Supernets]:
    """Train the supernet(s) of a space whose remedies change supernet training, or read
    back finished ones from ``out``; returns the result (steps, wall time, final metrics,
    the loss curve of each branch) and the :class:`Supernets`. An interrupted run starts
    again: nothing is saved before the end."""
    config = supernet_config(space)
    task = make_task(config.task, **config.task_params)
    net = with_vocab(one.supernet(space), task.vocab_size)
    remedy, loops = space.spec.oneshot.remedy, space.spec.oneshot.loops
    mark = _fingerprint(net, config, remedy)
    if (out / RESULT).is_file() and (out / WEIGHTS).is_file():
        # a model (and its gates) a branch: the options of a few-shot split, else one
        branches = len(net.layers[0].mixer.options) if remedy.few_shot is not None else 1
        saved = load(out / WEIGHTS, cap=checkpoint_cap(net, copies=2 * branches))
        done = _result(out / RESULT)
        if saved.get("fingerprint") == mark and done is not None:
            return done, _restore(net, config, loops, saved)
    start = time.perf_counter()
    steps = total_steps(config, task)
    few = remedy.few_shot
    split = round(steps * few.warm) if few is not None else steps
    shared = _fit(_start(net, config, loops, remedy.per_loop_gates), net, config, task, remedy, loops,
                  range(split), steps)
    if few is None:
        states: dict[int | None, _State] = {None: shared}
    else:
        options = len(net.layers[0].mixer.options)
        states = {b: _fit(shared.fork(), net, config, task, remedy, loops, range(split, steps), steps, b)
                  for b in range(options)}
    nets = Supernets(net, {b: s.model.eval() for b, s in states.items()}, {b: s.gates for b, s in states.items()})
    batches = eval_batches(task, config, torch.device(config.device))
    k = max(loops) if loops else None
    final = {str(b): evaluate(nets.model_for([b or 0] * net.L, k), task, batches, loops=k) for b in states}
    result = {"status": "ok", "steps": steps, "split": split if few is not None else None,
              "wall_time": time.perf_counter() - start, "final": final.get("None") or final,
              "losses": {str(b): s.losses for b, s in states.items()}}
    out.mkdir(parents=True, exist_ok=True)
    save(out / WEIGHTS, {"fingerprint": mark, "branches": {
        str(b): {"model": s.model.state_dict(), "gates": s.gates.state_dict() if s.gates else None}
        for b, s in states.items()}})
    write_text(out / RESULT, json.dumps(result, indent=2))
    return result, nets


def _restore(net: ArchSpec, config: TrainConfig, loops, saved: dict) -> Supernets:
    models, gates = {}, {}
    for key, entry in saved["branches"].items():
        b = None if key == "None" else int(key)
        models[b] = build_model(net, backend=config.backend, device=config.device)
        models[b].load_state_dict(entry["model"])
        models[b].eval()
        gates[b] = None
        if entry["gates"] is not None:
            gates[b] = LoopGates(models[b], loops).to(config.device)
            gates[b].load_state_dict(entry["gates"])
    return Supernets(net, models, gates)


def finetune_config(space: Space) -> TrainConfig:
    """The stand-alone proxy settings (``proxy``, at the search seed) a fine-tune runs with."""
    return TrainConfig.model_validate({**space.spec.proxy.trainer(), "seed": space.spec.search.seed,
                                       "progress": False})


def finetune_steps(space: Space) -> int:
    """``oneshot.remedy.finetune.fraction`` of the stand-alone steps, at least one."""
    config = finetune_config(space)
    steps = total_steps(config, make_task(config.task, **config.task_params))
    return max(1, round(space.spec.oneshot.remedy.finetune.fraction * steps))


def finetune(sub: LoopLM, config: TrainConfig, task: Task, steps: int) -> LoopLM:
    """Train ``sub`` (a sub-network holding the supernet's weights) ``steps`` steps on the
    proxy's task, as its stand-alone run would (a warmup of at most a quarter of them, then
    cosine decay); every candidate sees the same batches. Returns it in eval mode."""
    config = config.model_copy(update={"warmup_steps": min(config.warmup_steps, steps // 4)})
    device = next(sub.parameters()).device
    optimizer = torch.optim.AdamW(param_groups(sub, config.weight_decay), lr=config.lr, betas=config.betas)
    gen = torch.Generator().manual_seed(config.seed)
    sub.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, config)
        x, y = (t.to(device) for t in task.batch(config.batch_size, gen))
        sub(x, y).loss.backward()
        torch.nn.utils.clip_grad_norm_(sub.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return sub.eval()


__all__ = ["WEIGHTS", "LoopGates", "Supernets", "draw_pattern", "distill_loss", "sandwich_draws",
           "train_remedied", "finetune_config", "finetune_steps", "finetune"]
