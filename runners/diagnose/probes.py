"""Hooks that observe or intercept one *application* of a weight-shared sublayer.

A compiled :class:`builders.model.LoopLM` executes its plan (``nas.plan``) by calling
``layers[ℓ].mixer_norm`` then ``layers[ℓ].mixer`` once per mixer application (and
``ffn_norm``/``ffn`` per FFN application), in the order of ``nas.plan.unroll``. So the
``n``-th call of ``layers[ℓ].mixer`` in one forward pass is the ``n``-th mixer application of
layer ℓ in ``unroll`` order, whose loop path gives its iteration τ. Counters are reset by a
pre-hook on ``model.embed`` (called once per ``hidden()``), so nothing in ``builders/``
changes and every hook is removed when its context exits.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from builders.layers.attention import Attention, DeepSeekSparseAttention, resolve_window
from nas.plan import unroll


@dataclass(frozen=True)
class App:
    """One sublayer application of the unrolled plan."""

    index: int                  # position in execution order
    layer: int
    op: str                     # "mixer" | "ffn"
    path: tuple[tuple[int, int], ...]   # ((loop region, iteration), ...), outermost first
    nth: int                    # how many earlier applications this sublayer had

    @property
    def iteration(self) -> int | None:
        """τ (0-based) of the innermost enclosing loop; None outside loops."""
        return self.path[-1][1] if self.path else None

    @property
    def looped(self) -> bool:
        return bool(self.path)

    def label(self) -> str:
        it = "" if self.iteration is None else f"@τ{self.iteration + 1}"
        return f"L{self.layer}.{self.op}{it}"


def applications(model, loops: int | None = None) -> list[App]:
    """Every sublayer application of ``model`` at ``loops``, in execution order."""
    seen: dict[tuple[int, str], int] = {}
    out = []
    for i, (addr, path) in enumerate(unroll(model.plan(loops))):
        key = (addr.layer, addr.op)
        out.append(App(i, addr.layer, addr.op, path, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out


def context_closed(mixer: nn.Module, x: torch.Tensor, **kwargs) -> torch.Tensor:
    """The mixer with every token processed alone: (B, T, D) → (B·T, 1, D) → mixer → back.

    Same module and weights, so projections, gates, norms and token-local nonlinearities
    are untouched; a length-1 sequence has no earlier position for a causal convolution to
    read (its zero left-padding leaves only the current tap) and a recurrent state that
    starts at zero, so nothing crosses positions. For causal mixers position 0 of the
    intact output equals position 0 of this one (tested).
    """
    b, t, d = x.shape
    return mixer(x.reshape(b * t, 1, d), **kwargs).reshape(b, t, -1)


def _reset_on_forward(model, counters: dict) -> torch.utils.hooks.RemovableHandle:
    def reset(_mod, _args):
        for key in counters:
            counters[key] = 0
    return model.embed.register_forward_pre_hook(reset)


@contextlib.contextmanager
def closed_at(model, layer: int, nth: int):
    """Inside the context, the ``nth`` application (0-based) of ``layers[layer].mixer`` in
    every forward pass is replaced by its :func:`context_closed` counterpart."""
    state = {"n": 0}
    busy = [False]

    def hook(mod, args, kwargs, out):
        if busy[0]:
            return None
        n, state["n"] = state["n"], state["n"] + 1
        if n != nth:
            return None
        busy[0] = True
        try:
            return context_closed(mod, args[0], **kwargs)
        finally:
            busy[0] = False

    handles = [_reset_on_forward(model, state),
               model.layers[layer].mixer.register_forward_hook(hook, with_kwargs=True)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@dataclass
class Streams:
    """Residual-stream tensors captured in one forward pass: ``points[i]`` is the stream as
    application ``i`` receives it (before its norm); the last point is the input of the
    final norm. ``attn[i]``: per-head attention probabilities (B, H, T, T) of the softmax
    attention leaves that ran in application ``i``."""

    points: list[torch.Tensor] = field(default_factory=list)
    attn: dict[int, list[torch.Tensor]] = field(default_factory=dict)


def _attention_leaves(model) -> list[tuple[int, nn.Module]]:

    return [(i, m) for i, block in enumerate(model.layers) for m in block.mixer.modules()
            if isinstance(m, Attention) and not isinstance(m, DeepSeekSparseAttention)]


def attention_probs(q: torch.Tensor, k: torch.Tensor, window: int | None) -> torch.Tensor:
    """softmax(q kᵀ / √d) under the causal (windowed) mask: q (B, T, HQ, d), k (B, T, H, d)
    → (B, HQ, T, T), the probabilities ``builders.ops.attention.attention`` uses."""
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * q.shape[-1] ** -0.5
    t = q.shape[1]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    mask = (j <= i) & ((i - j < window) if window else True)
    return s.masked_fill(~mask.to(s.device), float("-inf")).softmax(-1)


@contextlib.contextmanager
def capture(model, attention: bool = False, gate_off: bool = False, leaf: list | None = None):
    """Record the residual stream at every application (:class:`Streams`).

    ``attention``: also record softmax attention probabilities, recomputed from each plain
    ``attn`` leaf's own q/k (its ``project``) under the window of that call (the layer's
    own, or a loop schedule's override). ``gate_off``: bypass every SDPA output gate (o·1 instead of
    o·σ(g)), an ablation of the trained gate. ``leaf``: if a list, the embedding output is
    replaced by a leaf tensor requiring grad, appended to it (for Jacobians).
    """
    rec = Streams()
    handles, patched = [], []

    def point(_mod, args):
        rec.points.append(args[0])

    for block in model.layers:
        handles.append(block.mixer_norm.register_forward_pre_hook(point))
        if block.has_ffn:
            handles.append(block.ffn_norm.register_forward_pre_hook(point))
    handles.append(model.norm.register_forward_pre_hook(point))
    def reset(_mod, _args):
        rec.points.clear()
        rec.attn.clear()

    handles.append(model.embed.register_forward_pre_hook(reset))
    if leaf is not None:
        def as_leaf(_mod, _args, out):
            x = out.detach().requires_grad_(True)
            leaf.append(x)
            return x
        handles.append(model.embed.register_forward_hook(as_leaf))
    for _layer, mod in _attention_leaves(model) if (attention or gate_off) else []:
        if attention:
            window: dict = {}

            def remember(_mod, _args, kwargs, _window=window):
                _window["w"] = resolve_window(_mod.window_size, kwargs.get("window"))

            def project(x, _orig=mod.project, _window=window):
                q, k, v = _orig(x)
                probs = attention_probs(q.detach(), k.detach(), _window.get("w"))
                rec.attn.setdefault(len(rec.points) - 1, []).append(probs)
                return q, k, v
            handles.append(mod.register_forward_pre_hook(remember, with_kwargs=True))
            mod.project = project
        if gate_off and mod.output_gate:
            mod.output = lambda x, o, _mod=mod: _mod.o_proj(o.flatten(2))
        patched.append(mod)
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
        for mod in patched:
            for name in ("project", "output"):
                mod.__dict__.pop(name, None)


__all__ = ["App", "Streams", "applications", "attention_probs", "capture", "closed_at",
           "context_closed"]
