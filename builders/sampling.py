"""Which option every ``switch`` layer runs in one forward pass: the placement sampler.

Two sampling modes (``random_placement.sampling``):

- ``ratio`` (LT2 §3.3, PostNAS): a pattern is a uniformly random permutation of the
  hybrid's names at exactly the spec's ratio (``ratio_counts(ratio, L)``), so every
  sampled pattern has the ratio's number of layers of each kind; option i lands in a given
  layer with probability ``count_i / L``;
- ``uniform`` (one-shot supernet path sampling): every switch layer draws its option on
  its own from its ``weights``.

Either way, option i of a switch runs with the probability the canonical
``SwitchSpec.weights`` states and the cost model prices (validation ties the two).
Executor and evaluation share this one definition. How often a training pattern is drawn
(``sampling_per``: every forward pass, or once per optimizer step) is the executor's
business: :meth:`builders.model.LoopLM.start_step` and ``hold_pattern``.
"""
from __future__ import annotations

import torch

from nas.placement import ratio_counts
from nas.spec import ArchSpec, SwitchSpec


def _permutation(arch: ArchSpec, num_layers: int, generator) -> list[int]:
    rp = arch.random_placement
    counts = ratio_counts(rp.ratio, num_layers)
    names = [n for n, c in counts.items() for _ in range(c)]
    perm = torch.randperm(len(names), generator=generator).tolist()
    order = list(rp.ratio)
    return [order.index(names[i]) for i in perm]


def _independent(arch: ArchSpec, generator) -> list[int]:
    """One draw per switch layer from its weights; layers sharing weights draw together."""
    pattern = [0] * len(arch.layers)
    groups: dict[tuple[float, ...], list[int]] = {}
    for i, layer in enumerate(arch.layers):
        if isinstance(layer.mixer, SwitchSpec):
            groups.setdefault(layer.mixer.weights, []).append(i)
    for weights, rows in groups.items():
        w = torch.tensor(weights, dtype=torch.float64)
        draws = torch.multinomial(w, len(rows), replacement=True, generator=generator).tolist()
        for i, option in zip(rows, draws):
            pattern[i] = option
    return pattern


def sample_pattern(arch: ArchSpec, num_layers: int, generator: torch.Generator | None = None
                   ) -> list[int] | None:
    """A random-placement pattern: the option index of each layer (None when the spec has
    no random placement). Non-switch layers get 0 (their entry is unused)."""
    rp = arch.random_placement
    if rp is None:
        return None
    if rp.sampling == "uniform":
        return _independent(arch, generator)
    return _permutation(arch, num_layers, generator)


__all__ = ["sample_pattern"]
