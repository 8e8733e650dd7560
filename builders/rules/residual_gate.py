"""``h_τ = f(h_{τ-1}) + ρ_τ ⊙ h_{τ-1}``; ρ zero-initialised. A shared ρ lives on the model
(``LoopLM.rho``) and arrives as ``rho``; otherwise the region owns ``rho`` (m, d)."""
import torch
from torch import nn

from . import LoopRule, register


@register("residual_gate")
class ResidualGate(LoopRule):
    def build(self, mod, r, width, m):
        mod.shared_rho = r.update.shared
        if not r.update.shared:
            mod.rho = nn.Parameter(torch.zeros(m, width))

    def reset(self, mod):
        if hasattr(mod, "rho"):
            nn.init.zeros_(mod.rho)

    def update(self, mod, prev, out, t, rho):
        return out + (rho if mod.shared_rho else mod.rho)[t] * prev
