"""The execution plan, arithmetically: how often each sublayer runs at a loop count
(:class:`Counts`), as what op each application runs (loop-level schedule overrides, switch
options), without building the plan tree."""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple

from ..plan import flat_counts, iteration_overrides, schedules_layer
from ..spec import ArchSpec, AttnSpec, DSASpec, NSASpec, Spec, SwitchSpec

# ops as run (schedule overrides here, per-op profiles in .sheet, which clears it at 2**16)
_CACHE: dict[tuple, tuple] = {}


def _key(op: Spec) -> tuple:
    """An op's identity as plain values: hashing it is far cheaper than pydantic's
    ``__hash__`` / ``__eq__`` on the model."""
    return type(op), tuple(op.__dict__.values())


class Counts(NamedTuple):
    """How often things run in one forward pass at a loop count.

    ``apps[f]``: applications of flat sublayer f (``2·layer + (0 mixer | 1 ffn)``), the
    product of ``T`` over the regions containing it (loops nest or are disjoint);
    ``updates[j]``: iterations after the first of region j, ``(T_j − 1)·Π T`` of the
    regions around it; ``T[j]``: region j's loop count; ``routed[f]``: applications that
    route afresh, the product of ``T`` over the regions containing f without routing replay
    (a replay region's later iterations reuse the routing of its first, as the executor
    does, and ELR's replay saves the router evaluations); ``iterations[j]``: iterations of
    region j, ``T_j · Π T`` of the regions around it."""

    apps: tuple[int, ...]
    updates: tuple[int, ...]
    T: tuple[int, ...]
    routed: tuple[int, ...]
    iterations: tuple[int, ...]


def counts(arch: ArchSpec, loops: int | None = None) -> Counts:
    """Equals :func:`nas.plan.applications` (tested) without building the plan tree.

    Regions sorted by (start, −end) meet their enclosing regions first, so a stack of
    (end, Π T inside) gives each region the product of the loop counts around it."""
    spans = [(r.start.flat, r.end.flat) for r in arch.loops]
    ts = tuple(r.T if loops is None else loops for r in arch.loops)
    apps = flat_counts(arch, loops)
    routed = flat_counts(arch, loops, skip=lambda r: r.routing_replay)
    updates, iterations = [0] * len(spans), [0] * len(spans)
    stack: list[tuple[int, int]] = []
    for j in sorted(range(len(spans)), key=lambda j: (spans[j][0], -spans[j][1])):
        a, b = spans[j]
        while stack and stack[-1][0] < a:
            stack.pop()
        outer = stack[-1][1] if stack else 1
        updates[j], iterations[j] = (ts[j] - 1) * outer, ts[j] * outer
        stack.append((b, outer * ts[j]))
    return Counts(tuple(apps), tuple(updates), ts, tuple(routed), tuple(iterations))


def with_override(op: Spec, window, topk) -> Spec:
    """``op`` as one scheduled iteration runs it: ``window`` (``"full"`` → none) for
    attn/nsa, ``topk`` for dsa; None leaves a field alone. Cached."""
    key = ("override", _key(op), window, topk)
    out = _CACHE.get(key)
    if out is None:
        update = {}
        if window is not None and isinstance(op, (AttnSpec, NSASpec)):
            update["window"] = None if window == "full" else window
        if topk is not None and isinstance(op, DSASpec):
            update["topk"] = topk
        out = _CACHE[key] = op.model_copy(update=update) if update else op
    return out


def mixer_settings(arch: ArchSpec, layer: int, c: Counts) -> list[tuple[int, Spec]]:
    """``(applications, mixer as run)`` for one layer's mixer under loop-level schedules.

    An application inside iteration t of region j takes j's overrides for (t, layer);
    regions are applied outer to inner, so the innermost override wins (as the executor
    does). Each iteration combination of the scheduling regions covers an equal share of
    the applications; iterations beyond a schedule (elastic k > T) run the mixer as is."""
    mixer, apps = arch.layers[layer].mixer, c.apps[2 * layer]
    regs = sorted((r.start.flat - r.end.flat, j, t) for j, (r, t) in enumerate(zip(arch.loops, c.T))
                  if r.start.flat <= 2 * layer <= r.end.flat and schedules_layer(r, layer))
    if not regs:
        return [(apps, mixer)]
    share = apps // math.prod(t for _, _, t in regs)
    runs: dict[tuple, int] = {}
    for combo in itertools.product(*(range(t) for _, _, t in regs)):
        o = iteration_overrides(arch, layer, [(j, it) for (_, j, _), it in zip(regs, combo)])
        key = o.get("window"), o.get("topk")
        runs[key] = runs.get(key, 0) + share
    return [(k, with_override(mixer, w, tk)) for (w, tk), k in runs.items()]


def switch_weights(arch: ArchSpec) -> tuple[tuple[float, ...] | None, ...]:
    """Per layer, the probability of each switch option (its canonical ``weights``, which
    validation ties to random placement); None for a layer that is not a switch."""
    return tuple(l.mixer.weights if isinstance(l.mixer, SwitchSpec) else None for l in arch.layers)


def layer_choices(mixer: Spec) -> tuple[tuple[float, Spec], ...]:
    """``(probability, op)`` pairs a layer's mixer runs as: itself, or a switch's options
    at the switch's weights."""
    if not isinstance(mixer, SwitchSpec):
        return ((1.0, mixer),)
    if mixer.weights is None:
        raise ValueError("a switch without weights; lower and validate the spec (nas.resolve) "
                         "before pricing it")
    return tuple(zip(mixer.weights, mixer.options))
