"""The executor half of each cross-loop rule, keyed like :mod:`nas.rules` (the update
rule's ``kind``, then region options). A rule adds its parameters to the region's
:class:`builders.loops.LoopExtras` under the names the cost model counts, initialises
them at the identity the papers start from, and runs at two points of every iteration:
``enter`` (the state fed to the iteration's body) and ``update`` (the state after it)."""
from __future__ import annotations

import torch
from torch import nn

from nas.registry import register_once
from nas.spec import LoopRegion


class LoopRule:
    """Defaults: no parameters, the state passes through."""

    def build(self, mod: nn.Module, r: LoopRegion, width: int, m: int) -> None:
        pass

    def reset(self, mod: nn.Module) -> None:
        """Initialise this rule's parameters (after the model's global init)."""

    def enter(self, mod: nn.Module, h: torch.Tensor, e: torch.Tensor, t: int, T: int) -> torch.Tensor:
        return h

    def update(self, mod: nn.Module, prev: torch.Tensor, out: torch.Tensor, t: int,
               rho: torch.Tensor | None) -> torch.Tensor:
        return out

    def conditioning(self, mod: nn.Module) -> list[nn.Parameter]:
        """Parameters an elastic run holds at zero before its switch."""
        return []


RULES: dict[str, LoopRule] = {}


def register(key: str):
    """Register the executor of rule ``key`` (an update rule's kind or a region option; once)."""
    return register_once(RULES, key, what="loop rule", value=lambda cls: cls())


from . import conditioning, gated_step, iteration_norm, plain, reinject, residual_gate  # noqa: E402,F401

__all__ = ["LoopRule", "RULES", "register"]
