"""Ouro's sandwich norm: the state after every iteration is normalised (``loops.{j}.norm``,
the region's norm kind), so the state entering each iteration has a fixed scale."""
from torch import nn

from . import LoopRule, register


@register("iteration_norm")
class IterationNorm(LoopRule):
    def build(self, mod, r, width, m):
        spec = r.iteration_norm
        mod.norm = nn.LayerNorm(width, eps=spec.eps) if spec.kind == "layernorm" else nn.RMSNorm(width, eps=spec.eps)

    def reset(self, mod):
        mod.norm.reset_parameters()

    def update(self, mod, prev, out, t, rho):
        return mod.norm(out)
