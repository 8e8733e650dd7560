"""Elastic depth (ELR): which loop count each training row runs, and what each count costs.

ELR mixes loop counts *inside* every optimizer update (different data-parallel ranks run
different counts on their micro-batches); a single count per update ("lockstep", Huginn)
loses the one-loop endpoint. Here every row of a micro-batch draws its count from
``elastic.train``, and the rows that drew the same count form one micro-batch of that
depth, so every update mixes depths whatever the gradient-accumulation setting. That is
``per: row``, the default; ``per: micro_batch`` draws one count per micro-batch and
``per: step`` one per optimizer step (Huginn's lockstep, :func:`step_dist`). Mixing starts
at the ``switch_at`` fraction of training (ELR's late switch); before it every row runs one
loop, the schedule :mod:`nas.elastic` defines for the cost model too. A run past its switch
is evaluated at every ``elastic.eval`` count (:func:`elastic_points`): one trained model, one
(quality, compute) point per count.
"""
from __future__ import annotations

from typing import Callable

import torch
from pydantic import BaseModel

from nas.cost import projection_flops
from nas.elastic import before_switch, switch_step, train_dist
from nas.spec import ArchSpec, LoopDist


class ElasticPoint(BaseModel):
    """One checkpoint evaluated at ``k`` loops: its quality and projection FLOPs per token."""

    k: int
    quality: float
    compute: float
    metrics: dict[str, float]


def draw_counts(dist: LoopDist, n: int, generator: torch.Generator) -> list[int]:
    """``n`` loop counts drawn from ``dist``'s table (its exact probabilities, which the cost
    model's expectations read; for ``poisson_lognormal`` the marginal of Huginn's
    τ → Poisson draw)."""
    weights = torch.tensor(dist.weights, dtype=torch.float64)
    draws = torch.multinomial(weights, n, replacement=True, generator=generator)  # (n,)
    return [dist.values[i] for i in draws.tolist()]


def step_dist(dist: LoopDist | None, generator: torch.Generator) -> LoopDist | None:
    """The optimizer step's distribution: for ``per: step``, one count drawn for the whole
    step (every micro-batch of the step runs it); any other distribution unchanged. The
    trainer calls this once per step, before its micro-batches."""
    if dist is None or dist.per != "step" or len(dist.values) == 1:
        return dist
    (k,) = draw_counts(dist, 1, generator)
    return LoopDist(values=(k,), weights=(1.0,))


def loop_groups(dist: LoopDist | None, batch_size: int, generator: torch.Generator
                ) -> list[tuple[int | None, torch.Tensor | None]]:
    """``(loops, rows)`` pairs that partition a micro-batch: ``rows`` indexes the batch
    (None: all of it) and ``loops`` is the count those rows run (None: the spec's T).
    ``per: row`` draws a count per row, ``micro_batch`` one for the micro-batch; a
    ``per: step`` distribution must be drawn first, once per step (:func:`step_dist`)."""
    if dist is None:
        return [(None, None)]
    if len(dist.values) == 1:
        return [(dist.values[0], None)]
    if dist.per == "step":
        raise ValueError("a per-step loop-count distribution is drawn once per optimizer step: "
                         "pass step_dist(dist, generator) to loop_groups")
    if dist.per == "micro_batch":
        return [(draw_counts(dist, 1, generator)[0], None)]
    weights = torch.tensor(dist.weights, dtype=torch.float64)
    draws = torch.multinomial(weights, batch_size, replacement=True, generator=generator)  # (B,)
    groups = []
    for i, k in enumerate(dist.values):
        rows = (draws == i).nonzero().flatten()
        if len(rows):
            groups.append((k, rows))
    return groups


def projection_compute(arch: ArchSpec, loops: int | None = None) -> float:
    """Projection FLOPs per token at ``loops`` (None: the spec's T), from the cost model:
    ``Σ applications · (C_A or C_F) + C_H`` (MixerLoop §3.3)."""
    return float(projection_flops(arch, loops=loops).total)


def trained_loops(arch: ArchSpec, step: int, total: int) -> int | None:
    """The loop count a model has trained at after ``step`` of ``total`` steps, which its
    evaluations run: 1 before an elastic switch, else None (the spec's T)."""
    return 1 if before_switch(arch, step - 1, total) else None


def switched_at(arch: ArchSpec, step: int, total: int) -> int | None:
    """The first step of mixed-depth training, when a run that ended after ``step`` of
    ``total`` steps got past it; else None (no elastic points are then reported)."""
    at = switch_step(arch, total) if arch.elastic is not None else None
    return at if at is not None and step > at else None


def elastic_points(arch: ArchSpec, evaluate_at: Callable[[int], dict[str, float]], metric: str
                   ) -> list[ElasticPoint]:
    """The trained model evaluated at every ``elastic.eval`` count (``evaluate_at(k)``:
    its eval metrics at ``k`` loops), priced at that count's projection compute."""
    points = []
    for k in arch.elastic.eval:
        metrics = evaluate_at(k)
        points.append(ElasticPoint(k=k, quality=metrics[metric], compute=projection_compute(arch, k),
                                   metrics=metrics))
    return points


__all__ = ["ElasticPoint", "train_dist", "before_switch", "draw_counts", "step_dist", "loop_groups",
           "projection_compute", "trained_loops", "switched_at", "elastic_points"]
