"""Cross-loop machinery of one loop region: its rules (update rule, re-injection,
conditioning, iteration norm; :mod:`builders.rules`) and truncated backpropagation.

Everything that could change a looped model's function starts at the identity where the
papers say so: ρ = 0 (LT2/MixerLoop), conditioning tables = 0 (ELR), so a looped model
starts as plain composition and ``loops=1`` of an ELR model is the plain model.
"""
from __future__ import annotations

import torch
from torch import nn

from nas.rules import rule_keys
from nas.spec import LoopRegion

from .rules import RULES


class LoopExtras(nn.Module):
    """Parameters and per-iteration steps of one region: ``m`` is the largest loop count
    it may run. The executor calls ``enter(h, e, t, T)`` before iteration ``t`` of ``T``
    (``e``: the region input) and ``update(prev, out, t, rho)`` after it."""

    def __init__(self, region: LoopRegion, width: int, m: int):
        super().__init__()
        self.keys = rule_keys(region)
        self.shared_rho = False
        for key in self.keys:
            RULES[key].build(self, region, width, m)
        self.truncate = region.truncate
        self._count: int | None = None

    def reset_parameters(self) -> None:
        """Loop-specific initialisation (called after the model's global init)."""
        for key in self.keys:
            RULES[key].reset(self)

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """The loop-conditioning tables: frozen at zero before an elastic run's switch."""
        return [p for key in self.keys for p in RULES[key].conditioning(self)]

    def carries_grad(self, t: int, T: int) -> bool:
        """Whether iteration ``t`` of ``T`` is among the last ``truncate`` (all of them
        without truncation). The executor runs the others without a graph (saving their
        activations) where only their state reaches the loss; :meth:`enter` detaches at the
        cut either way, so results and gradients are the same."""
        return self.truncate is None or t >= T - self.truncate

    def _cut(self, t: int, T: int) -> bool:
        """Whether iteration ``t`` of ``T`` is the first one that carries gradient."""
        return self.truncate is not None and T > self.truncate and t == T - self.truncate

    def enter(self, h: torch.Tensor, e: torch.Tensor, t: int, T: int) -> torch.Tensor:
        """State fed to iteration ``t`` of ``T``: truncation (the state entering the last
        ``truncate`` iterations is detached; ``e`` keeps its gradient), then each rule."""
        self._count = T
        if self._cut(t, T):
            h = h.detach()
        for key in self.keys:
            h = RULES[key].enter(self, h, e, t, T)
        return h

    def update(self, prev: torch.Tensor, out: torch.Tensor, t: int,
               shared_rho: torch.Tensor | None) -> torch.Tensor:
        """Combine iteration ``t``'s output with the state before it (detached at the
        truncation point, as in :meth:`enter`)."""
        if self._count is not None and self._cut(t, self._count):
            prev = prev.detach()
        for key in self.keys:
            out = RULES[key].update(self, prev, out, t, shared_rho)
        return out


__all__ = ["LoopExtras"]
