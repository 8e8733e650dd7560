"""Re-injection of the region input ``e``: ``add`` ``h + e``; ``concat`` ``W [h; e]`` with
W = [I, 0] at init; ``diagonal`` ``a ⊙ h + b ⊙ e``, ``a = exp(−softplus(·)) ∈ (0, 1)``
(a contraction: stable), a = ½ and b = ½ at init. From the second iteration on, or,
with ``initial_state`` zeros / random (Huginn's s₀ ~ N(0, σ²)), from the first, on that
state."""
import torch
import torch.nn.functional as F
from torch import nn

from . import LoopRule, register


@register("reinject")
class Reinject(LoopRule):
    def build(self, mod, r, width, m):
        mod.reinject_mode, mod.initial_state, mod.init_std = r.update.mode, r.update.initial_state, r.update.init_std
        if r.update.mode == "concat":
            mod.reinject = nn.Linear(2 * width, width, bias=False)
        elif r.update.mode == "diagonal":
            mod.reinject_a = nn.Parameter(torch.zeros(width))
            mod.reinject_b = nn.Parameter(torch.full((width,), 0.5))

    def reset(self, mod):
        if hasattr(mod, "reinject"):
            width = mod.reinject.out_features
            with torch.no_grad():
                mod.reinject.weight.zero_()
                mod.reinject.weight[:, :width].copy_(torch.eye(width))
        if hasattr(mod, "reinject_a"):
            nn.init.zeros_(mod.reinject_a)
            nn.init.constant_(mod.reinject_b, 0.5)

    def enter(self, mod, h, e, t, T):
        if t == 0:
            if mod.initial_state == "input":
                return h
            h = torch.zeros_like(e) if mod.initial_state == "zeros" else torch.randn_like(e) * mod.init_std
        if mod.reinject_mode == "add":
            return h + e
        if mod.reinject_mode == "concat":
            return mod.reinject(torch.cat([h, e], dim=-1))
        a = torch.exp(-F.softplus(mod.reinject_a))  # (D,) in (0, 1)
        return a * h + mod.reinject_b * e
