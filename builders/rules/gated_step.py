"""ELR: ``h ← h + g ⊙ (f(h) − h)``, ``g = σ(W [h; f(h)] + b)`` from the second iteration
on; W, b zero-initialised, so g = 1/2 at the start."""
import torch
from torch import nn

from . import LoopRule, register


@register("gated_step")
class GatedStep(LoopRule):
    def build(self, mod, r, width, m):
        mod.gate = nn.Linear(2 * width, width)

    def reset(self, mod):
        nn.init.zeros_(mod.gate.weight)
        nn.init.zeros_(mod.gate.bias)

    def update(self, mod, prev, out, t, rho):
        if t == 0:
            return out
        g = torch.sigmoid(mod.gate(torch.cat([prev, out], dim=-1)))  # (B, T, D)
        return prev + g * (out - prev)
