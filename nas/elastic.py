"""ELR's training schedule of loop counts: the one definition the trainer runs and the
cost model prices.

Per ELR, a late-switch run trains a plain single-loop model until ``switch_at`` and only
then mixes loop counts drawn from ``elastic.train``; loop conditioning enters at the
switch through zero-initialised heads, so mixed-depth training starts from the trained
one-loop checkpoint. Without elastic depth every step runs each region's own ``T``.
"""
from __future__ import annotations

import math

from .spec import ArchSpec, LoopDist

ONE_LOOP = LoopDist(values=(1,), weights=(1.0,))


def phases(arch: ArchSpec) -> tuple[tuple[float, LoopDist | None], ...]:
    """``(fraction of training, loop-count distribution)`` in order; None: each region's
    own ``T``. Fractions sum to 1."""
    if arch.elastic is None:
        return ((1.0, None),)
    s = arch.elastic.switch_at
    mixed = (1.0 - s, arch.elastic.train)
    return ((s, ONE_LOOP), mixed) if s > 0 else (mixed,)


def switch_step(arch: ArchSpec, total: int) -> int:
    """First optimizer step (0-based, of ``total``) that mixes loop counts: ``⌈s·total⌉``,
    so the one-loop phase has the ``switch_at`` fraction of the steps, rounded up."""
    assert arch.elastic is not None
    return math.ceil(arch.elastic.switch_at * total)


def before_switch(arch: ArchSpec, step: int, total: int) -> bool:
    """True while an elastic run trains its single-loop model (conditioning frozen at 0)."""
    return arch.elastic is not None and step < switch_step(arch, total)


def train_dist(arch: ArchSpec, step: int, total: int) -> LoopDist | None:
    """The loop-count distribution of optimizer step ``step`` of ``total``; None: each
    region's own ``T`` (no elastic depth)."""
    if arch.elastic is None:
        return None
    return ONE_LOOP if before_switch(arch, step, total) else arch.elastic.train


def expected(dist: LoopDist | None, value) -> float:
    """``E[value(k)]`` under ``dist`` (``value(None)`` for each region's own T)."""
    if dist is None:
        return value(None)
    return sum(w * value(k) for k, w in zip(dist.values, dist.weights)) / sum(dist.weights)


__all__ = ["ONE_LOOP", "phases", "switch_step", "before_switch", "train_dist", "expected"]
