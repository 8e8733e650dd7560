"""Assemble a canonical spec into a causal LM and execute its plan.

Parameter names (the cost model counts exactly these): ``embed``, ``layers.{i}.mixer_norm``,
``layers.{i}.mixer``, ``layers.{i}.ffn_norm``, ``layers.{i}.ffn`` (both absent when the
FFN kind is ``none``), ``norm``, ``lm_head`` (untied only), ``rho`` (the ρ shared by
regions with a shared residual gate), ``loops.{r}.*`` (per-region extras).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from nas.plan import (
    Loop, Node, Step, check_loops, iteration_overrides, max_loops, plan, total_applications,
)
from nas.rules import rules_of
from nas.spec import (
    ArchSpec, DSASpec, LoopRegion, MoESpec, NoFFNSpec, NormSpec, ParallelSpec, SwitchSpec, sub_mixers,
)

from .ops_registry import make_norm  # importing it registers every op builder
from .layers import fla_runtime
from .inference import InferenceCache, KVPolicy
from .loops import LoopExtras
from .sampling import sample_pattern
from .registry import BuildCtx, build_op, call_op


@dataclass
class LMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None      # ce_loss + aux_loss: what the trainer minimises
    ce_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None  # MoE load balance, weighted by each layer's coef


class Block(nn.Module):
    """One physical layer: a pre-norm residual mixer and a pre-norm residual FFN (or, with
    ``norm_placement: post``, each sublayer's output normalised before the residual add)."""

    def __init__(self, layer, norm: NormSpec, ctx: BuildCtx):
        super().__init__()
        self.post_norm = layer.norm_placement == "post"
        self.mixer_norm = make_norm(norm, ctx.width)
        self.mixer = build_op(layer.mixer, ctx)
        self.has_ffn = not isinstance(layer.ffn, NoFFNSpec)
        self.is_moe = isinstance(layer.ffn, MoESpec)
        if self.has_ffn:
            self.ffn_norm = make_norm(norm, ctx.width)
            self.ffn = build_op(layer.ffn, ctx)

    def mixer_step(self, h: torch.Tensor, **overrides) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The residual mixer and, returned explicitly, the auxiliary losses of every leaf
        that ran in it (:func:`builders.registry.call_op`)."""
        if self.post_norm:
            out, aux = call_op(self.mixer, h, **overrides)
            return h + self.mixer_norm(out), aux
        out, aux = call_op(self.mixer, self.mixer_norm(h), **overrides)
        return h + out, aux

    def ffn_step(self, h: torch.Tensor, routing=None) -> tuple[torch.Tensor, torch.Tensor | None, object]:
        """The residual FFN, and for an MoE its balance loss and the routing it used."""
        if not self.has_ffn:
            return h, None, None
        x = h if self.post_norm else self.ffn_norm(h)
        aux = used = None
        if self.is_moe:
            y, aux, used = self.ffn(x, routing=routing, return_routing=True)
        else:
            y = self.ffn(x)
        return h + (self.ffn_norm(y) if self.post_norm else y), aux, used

    def run_mixer(self, h: torch.Tensor, **overrides) -> torch.Tensor:
        """The residual mixer alone (references and probes; the executor uses mixer_step)."""
        return self.mixer_step(h, **overrides)[0]

    def run_ffn(self, h: torch.Tensor, routing=None) -> torch.Tensor:
        return self.ffn_step(h, routing)[0]


class _Run:
    """Per-forward state: current iteration (and count) of each enclosing loop, MoE
    routings to replay, accumulated auxiliary loss, the sampled random-placement pattern,
    the inference cache when decoding."""

    def __init__(self, pattern: list[int] | None, cache: InferenceCache | None = None):
        self.iters: dict[int, int] = {}
        self.counts: dict[int, int] = {}
        self.replay: dict[tuple[int, int], object] = {}
        self.aux: list[torch.Tensor] = []
        self.pattern = pattern
        self.cache = cache

    def final(self) -> bool:
        """Whether every enclosing loop is in its last iteration."""
        return all(t == self.counts[r] - 1 for r, t in self.iters.items())


class LoopLM(nn.Module):
    """A causal LM compiled from a canonical :class:`ArchSpec`.

    ``forward(input_ids, labels=None, loops=None)``: ``labels`` are aligned with the
    inputs (``labels[:, t]`` is the target of position ``t``; -100 is ignored), as the
    proxy tasks produce them; ``loops=k`` runs every loop region ``k`` times.

    Activation checkpointing (:meth:`set_activation_checkpointing`): in training, every
    sublayer application (each iteration of a looped one) keeps only its input and is
    recomputed in the backward. The attribute names are transformers' own
    (``gradient_checkpointing``, ``_gradient_checkpointing_func``), so an exported model's
    ``gradient_checkpointing_enable()`` switches exactly this on.
    """

    gradient_checkpointing: bool = False
    _gradient_checkpointing_func = staticmethod(functools.partial(checkpoint, use_reentrant=False))

    def __init__(self, arch: ArchSpec, backend: Literal["torch", "fla"] = "torch"):
        super().__init__()
        assert arch.is_canonical, "build from a lowered spec (nas.lower / nas.load_arch)"
        self.arch, self.backend = arch, backend
        d, ctx = arch.model.width, BuildCtx(width=arch.model.width, backend=backend)
        self.embed = nn.Embedding(arch.model.vocab_size, d)
        self.layers = nn.ModuleList(Block(l, arch.model.norm, ctx) for l in arch.layers)
        self.norm = make_norm(arch.model.norm, d)
        if not arch.model.tie_embeddings:
            self.lm_head = nn.Linear(d, arch.model.vocab_size, bias=False)
        m = max_loops(arch)
        if "rho" in _shared_extras(arch, d, m):
            self.rho = nn.Parameter(torch.zeros(m, d))
        self.loops = nn.ModuleList(LoopExtras(r, d, m) for r in arch.loops)
        self._graphless_cut = tuple(r.truncate is not None and _state_only(arch, r) for r in arch.loops)
        self._plans: dict[int | None, tuple[Node, ...]] = {}
        self._held: list[int] | None = None  # the pattern training forward passes run, when held
        self.reset_parameters()

    def unrolled_depth(self) -> int:
        """Sublayer applications in one forward pass at the spec's loop counts."""
        return total_applications(self.arch)

    def reset_parameters(self) -> None:
        """GPT-2 style: linears and embeddings N(0, σ); output projections of residual
        branches scaled by 1/√(unrolled depth), since a looped model adds each branch once
        per application; op-specific parameters (A_log, dt_bias, convs, norms) keep the
        initialisation of their layer; loop extras start at the identity."""
        std = self.arch.model.init_std
        out_std = std / math.sqrt(max(1, self.unrolled_depth()))
        nn.init.normal_(self.embed.weight, std=std)
        if hasattr(self, "lm_head"):
            nn.init.normal_(self.lm_head.weight, std=std)
        for block in self.layers:
            for name, mod in block.named_modules():
                if isinstance(mod, nn.Linear):
                    last = name.rsplit(".", 1)[-1]
                    is_out = last in ("o_proj", "out_proj", "down_proj", "proj")
                    nn.init.normal_(mod.weight, std=out_std if is_out else std)
                    if mod.bias is not None:
                        nn.init.zeros_(mod.bias)
        if hasattr(self, "rho"):
            nn.init.zeros_(self.rho)
        for extras in self.loops:
            extras.reset_parameters()

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """Every region's loop-conditioning tables (ELR's zero-initialised heads)."""
        return [p for extras in self.loops for p in extras.conditioning_parameters()]

    def plan(self, loops: int | None = None) -> tuple[Node, ...]:
        if loops not in self._plans:
            check_loops(self.arch, loops)
            self._plans[loops] = plan(self.arch, loops)
        return self._plans[loops]

    def set_activation_checkpointing(self, enabled: bool = True, fn=None) -> None:
        """Recompute every sublayer application in the backward instead of keeping its
        activations (same loss and gradients; RNG state is replayed). ``fn``: the
        checkpoint function, ``fn(step, h, *args, **kwargs)`` (default: non-reentrant
        ``torch.utils.checkpoint.checkpoint``)."""
        self.gradient_checkpointing = enabled
        if fn is not None:
            self._gradient_checkpointing_func = fn

    def _apply_step(self, step, h: torch.Tensor, *args, **kwargs):
        """``step(h, ...)``, checkpointed when that is on and a graph is being built. Only
        non-reentrant checkpointing is exact here: a step's outputs (auxiliary losses, MoE
        routings replayed by later iterations) and inputs are not all plain tensors."""
        if not (self.gradient_checkpointing and self.training and torch.is_grad_enabled()):
            return step(h, *args, **kwargs)
        fn = self._gradient_checkpointing_func
        if getattr(fn, "keywords", {}).get("use_reentrant", False):
            raise ValueError("loopnas checkpoints non-reentrantly (sublayers return auxiliary losses "
                             "and MoE routings): pass use_reentrant=False")
        return fn(step, h, *args, **kwargs)

    def _overrides(self, layer: int, run: _Run) -> dict:
        return iteration_overrides(self.arch, layer, run.iters.items())  # outermost first

    def _step(self, addr, h: torch.Tensor, run: _Run) -> torch.Tensor:
        block = self.layers[addr.layer]
        if addr.op == "mixer":
            spec, kw = self.arch.layers[addr.layer].mixer, self._overrides(addr.layer, run)
            option = run.pattern[addr.layer] if run.pattern is not None else 0
            if isinstance(spec, SwitchSpec):
                kw["option"] = option
            if run.cache is not None:
                kw["cache"], kw["commit"] = run.cache.mixer_cache(addr.layer, tuple(run.iters.items()), run.final())
            h, aux = self._apply_step(block.mixer_step, h, **kw)
            if self.training:  # DSA's indexer loss, wherever its leaf sits (parallel, switch)
                run.aux += [a for a in aux if a.requires_grad]
            return h
        if not block.is_moe:
            return self._apply_step(block.ffn_step, h)[0]
        replay_key = next(((r, addr.layer) for r, t in run.iters.items()
                           if self.arch.loops[r].routing_replay and t > 0), None)
        routing = run.replay.get(replay_key) if replay_key else None
        h, aux, used = self._apply_step(block.ffn_step, h, routing=routing)
        for r, t in run.iters.items():
            if self.arch.loops[r].routing_replay and t == 0:
                run.replay[(r, addr.layer)] = used
        if routing is None:
            run.aux.append(aux * self.arch.layers[addr.layer].ffn.aux_loss_coef)
        return h

    def _loop(self, node: Loop, h: torch.Tensor, run: _Run) -> torch.Tensor:
        """Run a region's iterations. Those before a truncation cut build no graph when
        only their state reaches the loss (:func:`_state_only`): the state is detached at
        the cut anyway, so gradients are the same and their activations are not kept."""
        extras, e = self.loops[node.index], h
        rho = getattr(self, "rho", None)
        grad, graphless = torch.is_grad_enabled(), self._graphless_cut[node.index]
        run.counts[node.index] = node.T
        for t in range(node.T):
            run.iters[node.index] = t
            with torch.set_grad_enabled(grad and (not graphless or extras.carries_grad(t, node.T))):
                out = self._run(node.body, extras.enter(h, e, t, node.T), run)
                h = extras.update(h, out, t, rho)
        del run.iters[node.index]
        return h

    def _run(self, nodes: tuple[Node, ...], h: torch.Tensor, run: _Run) -> torch.Tensor:
        for node in nodes:
            h = self._step(node.addr, h, run) if isinstance(node, Step) else self._loop(node, h, run)
        return h

    def _pattern(self) -> list[int] | None:
        """A random-placement pattern (see :mod:`builders.sampling`)."""
        return sample_pattern(self.arch, len(self.layers))

    def _per_step(self) -> bool:
        rp = self.arch.random_placement
        return rp is not None and rp.sampling_per == "step"

    def _training_pattern(self) -> list[int] | None:
        if self._held is not None:
            return self._held
        if self._per_step():
            raise RuntimeError("hybrid.sampling_per is 'step': call model.start_step() once per "
                               "optimizer step, before its forward passes (or hold a pattern "
                               "with model.hold_pattern())")
        return self._pattern()

    def start_step(self, generator: torch.Generator | None = None) -> list[int] | None:
        """Begin an optimizer step (the trainer calls it before the step's forward passes).
        With random placement drawn per step (``hybrid.sampling_per: step``), draw the
        pattern every training forward pass runs until the next call, and return it; else
        do nothing (each forward pass draws its own) and return None."""
        if not self._per_step():
            return None
        self._held = sample_pattern(self.arch, len(self.layers), generator)
        return list(self._held)

    @contextlib.contextmanager
    def hold_pattern(self, pattern: Sequence[int] | None = None) -> Iterator[list[int]]:
        """Every training forward pass inside runs ``pattern`` (one option per layer; drawn
        once on entry when None), whatever ``sampling_per`` says; the previous state is
        restored on exit. Evaluation still votes over sampled patterns."""
        if self.arch.random_placement is None:
            raise ValueError("hold_pattern is for random-placement (switch) models; this model has none")
        held = list(pattern) if pattern is not None else self._pattern()
        if len(held) != len(self.layers):
            raise ValueError(f"a pattern has one option per layer: {len(self.layers)}, got {len(held)}")
        previous, self._held = self._held, held
        try:
            yield list(held)
        finally:
            self._held = previous

    def hidden(self, input_ids: torch.Tensor, loops: int | None = None,
               pattern: list[int] | None = None, cache: InferenceCache | None = None
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        run = _Run(pattern, cache)
        h = self._run(self.plan(loops), self.embed(input_ids), run)
        return self.norm(h), run.aux

    def head(self, h: torch.Tensor) -> torch.Tensor:
        weight = self.lm_head.weight if hasattr(self, "lm_head") else self.embed.weight
        return F.linear(h, weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                loops: int | None = None) -> LMOutput:
        rp = self.arch.random_placement
        if rp is not None and not self.training:
            logits, aux = self._vote(input_ids, loops, rp.eval_samples)
        else:
            h, aux = self.hidden(input_ids, loops, self._training_pattern())
            logits = self.head(h)
        aux_loss = torch.stack(aux).sum() if aux else None
        if labels is None:
            return LMOutput(logits=logits, aux_loss=aux_loss)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        loss = ce + aux_loss if aux_loss is not None else ce
        return LMOutput(logits=logits, loss=loss, ce_loss=ce, aux_loss=aux_loss)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, loops: int | None = None,
                pattern: list[int] | None = None, kv_policy: KVPolicy | None = None
                ) -> tuple[torch.Tensor, InferenceCache]:
        """Run the prompt ``input_ids`` (B, t) and return its logits (B, t, V) and the cache
        that :meth:`decode` continues. ``loops``: as in :meth:`forward`, kept for the whole
        session. ``pattern``: the option of every switch layer (random placement), one
        pattern for the whole session, sampled once when None (no voting while decoding).
        ``kv_policy``: the spec's when None."""
        self._check_decodable()
        if pattern is None:
            pattern = self._pattern()
        elif self.arch.random_placement is None:
            raise ValueError("pattern is for random-placement (switch) models; this model has none")
        cache = InferenceCache(self.arch, loops, pattern, kv_policy or self.arch.kv_policy)
        return self.decode(cache, input_ids), cache

    @torch.no_grad()
    def decode(self, cache: InferenceCache, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, t, V) of the next ``t`` tokens (usually 1) after those ``cache`` has
        seen, appending them to it."""
        h, _ = self.hidden(input_ids, cache.loops, cache.pattern, cache)
        cache.pos += input_ids.shape[1]
        return self.head(h)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, generator: torch.Generator | None = None,
                 loops: int | None = None, pattern: list[int] | None = None) -> torch.Tensor:
        """Prompt plus ``max_new_tokens`` tokens (B, prompt + new): greedy at temperature 0,
        else sampled from softmax(logits / temperature), restricted to the ``top_k`` most
        likely tokens when given. A random-placement model samples its pattern once (from
        ``generator`` when that is a CPU generator) unless ``pattern`` is given."""
        if pattern is None and self.arch.random_placement is not None:
            cpu = generator is not None and generator.device.type == "cpu"
            pattern = sample_pattern(self.arch, len(self.layers), generator if cpu else None)
        logits, cache = self.prefill(input_ids, loops, pattern)
        out = [input_ids]
        for i in range(max_new_tokens):
            out.append(_next_token(logits[:, -1], temperature, top_k, generator))
            if i + 1 < max_new_tokens:
                logits = self.decode(cache, out[-1])
        return torch.cat(out, dim=1)

    def _check_decodable(self) -> None:
        """Every mixer takes the decoding ``cache`` (one clear error instead of a TypeError
        deep in the plan)."""
        for i, block in enumerate(self.layers):
            leaves = getattr(block.mixer, "branches", None) or getattr(block.mixer, "options", None) or [block.mixer]
            for leaf in leaves:
                if "cache" not in inspect.signature(leaf.forward).parameters:
                    raise NotImplementedError(
                        f"layers.{i}.mixer: {type(leaf).__name__} does not support incremental "
                        f"decoding yet (its forward takes no cache)")

    def _vote(self, input_ids, loops, samples: int):
        """LT2's random placement at evaluation: average the predictive distributions of
        ``samples`` sampled patterns (returned as log-probabilities)."""
        probs, aux = 0.0, []
        for _ in range(samples):
            h, a = self.hidden(input_ids, loops, self._pattern())
            probs = probs + torch.softmax(self.head(h).float(), dim=-1) / samples
            aux += a
        return torch.log(probs.clamp_min(1e-30)), aux


def _shared_extras(arch: ArchSpec, d: int, m: int) -> set[str]:
    """Names of the loop-extra tensors the model holds once for every region that asks
    for them (:class:`nas.rules.Extra` ``shared``: the shared ρ)."""
    return {e.name for r in arch.loops for rule in rules_of(r) for e in rule.extras(r, d, m) if e.shared}


def _state_only(arch: ArchSpec, r: LoopRegion) -> bool:
    """Whether an iteration of region ``r`` reaches the loss only through the state it
    passes on: no MoE FFN (its auxiliary loss, a routing later iterations replay) and no
    DSA mixer (its indexer loss) among the sublayers it covers."""
    for flat in range(r.start.flat, r.end.flat + 1):
        op = getattr(arch.layers[flat // 2], "ffn" if flat % 2 else "mixer")
        sub = sub_mixers(op)
        if any(isinstance(leaf, (MoESpec, DSASpec)) for leaf in (sub[1] if sub else (op,))):
            return False
    return True


def _next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """(B, V) logits -> (B, 1) next tokens: argmax at temperature 0, else a sample."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def resolve_backend(backend: str, device) -> Literal["torch", "fla"]:
    """``auto`` → ``fla`` when ``device`` is CUDA and fla and triton are installed, else ``torch``.

    ``device=None`` (a model built on the CPU) resolves to ``torch`` even on a CUDA machine.
    An explicit ``fla`` on a device where fla's kernels cannot run is a
    :class:`FlaUnavailableError`, raised here or, for a model moved later, at its forward.
    """
    if backend not in ("auto", "torch", "fla"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'fla' (got {backend!r})")
    placed = device is not None and torch.device(device).type != "meta"
    if backend == "auto":
        on_cuda = placed and torch.device(device).type == "cuda"
        return "fla" if on_cuda and fla_runtime.unavailable_reason(device) is None else "torch"
    if backend == "fla" and placed and (reason := fla_runtime.unavailable_reason(device)):
        raise fla_runtime.FlaUnavailableError(f"backend='fla': {reason}; use backend='torch' or 'auto'")
    return backend


def build_model(spec: ArchSpec, backend: str = "auto", device=None, dtype=None) -> LoopLM:
    """Compile a spec (source or canonical) into a :class:`LoopLM`."""
    from nas.load import resolve

    arch = spec if spec.is_canonical else resolve(spec)
    be = resolve_backend(backend, device)
    if device is not None and torch.device(device).type == "meta":
        with torch.device("meta"):
            model = LoopLM(arch, be)
    else:
        model = LoopLM(arch, be)
    return model.to(device=device, dtype=dtype) if (device or dtype) else model


__all__ = ["LoopLM", "LMOutput", "Block", "build_model", "resolve_backend"]
