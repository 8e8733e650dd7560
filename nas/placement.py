"""Hybrid placement: which mixer name each layer gets for a ratio and a placement rule.

A leaf module (specs and errors only): lowering writes layers and switch weights with it,
validation checks them, and the executor's sampler reads random placement's per-layer
counts from it, without importing each other.
"""
from __future__ import annotations

import math

from .errors import fail
from .spec import HybridSpec


def ratio_counts(ratio: dict[str, int], L: int) -> dict[str, int]:
    """Layers per name by largest remainder, so counts sum to L."""
    total = sum(ratio.values())
    exact = {k: L * r / total for k, r in ratio.items()}
    counts = {k: math.floor(v) for k, v in exact.items()}
    by_remainder = sorted(exact, key=lambda k: (counts[k] - exact[k], list(ratio).index(k)))
    for k in by_remainder[: L - sum(counts.values())]:
        counts[k] += 1
    return counts


def _spread(free: list[int], n: int) -> list[int]:
    """n of the free slots, evenly spaced, each at the end of its stride."""
    m = len(free)
    return [free[i] for i in range(m) if (i + 1) * n // m > i * n // m]


def placement(hybrid: HybridSpec, L: int) -> list[str]:
    """The mixer name of each layer for a ratio and a placement rule."""
    if isinstance(hybrid.placement, tuple):
        if len(hybrid.placement) != L:
            raise fail("hybrid.placement", f"explicit placement lists {len(hybrid.placement)} "
                       f"layers but the model has {L}; give one name per layer")
        return list(hybrid.placement)
    counts = ratio_counts(hybrid.ratio, L)
    for name, c in counts.items():
        if c == 0:
            raise fail("hybrid.ratio", f"ratio {':'.join(map(str, hybrid.ratio.values()))} over "
                       f"{L} layers leaves '{name}' no layer; use at least "
                       f"{sum(hybrid.ratio.values())} layers or change the ratio")
    majority = max(counts, key=lambda k: (counts[k], list(counts).index(k)))
    minority = sorted((k for k in counts if k != majority), key=lambda k: counts[k])
    names: list[str | None] = [None] * L
    for name in minority:
        free = [i for i in range(L) if names[i] is None]
        n = counts[name]
        if hybrid.placement in ("interleave", "random"):
            slots = _spread(free, n)
        elif hybrid.placement == "bookend":
            slots = free[: (n + 1) // 2] + (free[len(free) - n // 2:] if n // 2 else [])
        elif hybrid.placement == "front":
            slots = free[:n]
        else:
            slots = free[len(free) - n:]
        for i in slots:
            names[i] = name
    return [n if n is not None else majority for n in names]


def option_weights(rp: HybridSpec, L: int) -> tuple[float, ...]:
    """Probability that a switch layer runs option i (options in ratio order) under random
    placement over ``L`` layers. ``ratio`` sampling: a pattern is a uniformly random
    permutation of ``ratio_counts(ratio, L)`` names, so name i lands in any given layer with
    probability ``count_i / L``. ``uniform``: each layer draws name i with probability
    ``ratio_i / Σ ratio``."""
    if rp.sampling == "uniform":
        total = sum(rp.ratio.values())
        return tuple(r / total for r in rp.ratio.values())
    counts = ratio_counts(rp.ratio, L)
    return tuple(counts[name] / L for name in rp.ratio)


__all__ = ["ratio_counts", "placement", "option_weights"]
