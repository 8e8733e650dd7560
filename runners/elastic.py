"""Elastic depth (ELR): which loop count each training row runs, and what each count costs.

ELR mixes loop counts *inside* every optimizer update (different data-parallel ranks run
different counts on their micro-batches); a single count per update ("lockstep", Huginn)
loses the one-loop endpoint. Here every row of a micro-batch draws its count from
``elastic.train``, and the rows that drew the same count form one micro-batch of that
depth, so every update mixes depths whatever the gradient-accumulation setting. Mixing
starts at the ``switch_at`` fraction of training (ELR's late switch); before it every row
runs one loop, the schedule :mod:`nas.elastic` defines for the cost model too.
"""
from __future__ import annotations

import torch

from nas.cost import projection_flops
from nas.elastic import before_switch, train_dist
from nas.spec import ArchSpec, LoopDist


def loop_groups(dist: LoopDist | None, batch_size: int, generator: torch.Generator
                ) -> list[tuple[int | None, torch.Tensor | None]]:
    """``(loops, rows)`` pairs that partition a micro-batch: ``rows`` indexes the batch
    (None: all of it) and ``loops`` is the count those rows run (None: the spec's T)."""
    if dist is None:
        return [(None, None)]
    if len(dist.values) == 1:
        return [(dist.values[0], None)]
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


__all__ = ["train_dist", "before_switch", "loop_groups", "projection_compute"]
