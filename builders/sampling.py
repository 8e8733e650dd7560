"""Which option every ``switch`` layer runs in one forward pass: the placement sampler.

LT2's random placement draws, for every forward pass in training, a permutation of the
hybrid's kinds at exactly the spec's ratio (``random_placement.ratio``), so every sampled
pattern has the ratio's number of layers of each kind. Executor and evaluation share this
one definition.
"""
from __future__ import annotations

import torch

from nas.placement import ratio_counts
from nas.spec import ArchSpec


def sample_pattern(arch: ArchSpec, num_layers: int, generator: torch.Generator | None = None
                   ) -> list[int] | None:
    """A random-placement pattern: the option index of each layer, at the hybrid ratio
    (None when the spec has no random placement)."""
    rp = arch.random_placement
    if rp is None:
        return None
    counts = ratio_counts(rp.ratio, num_layers)
    names = [n for n, c in counts.items() for _ in range(c)]
    perm = torch.randperm(len(names), generator=generator).tolist()
    order = list(rp.ratio)
    return [order.index(names[i]) for i in perm]


__all__ = ["sample_pattern"]
