"""Ouro's sandwich norm: the state after every iteration is normalised (``loops.{j}.norm``,
the region's norm kind), so the state entering each iteration has a fixed scale."""
from ..ops_registry import make_norm
from . import LoopRule, register


@register("iteration_norm")
class IterationNorm(LoopRule):
    def build(self, mod, r, width, m):
        mod.norm = make_norm(r.iteration_norm, width)

    def reset(self, mod):
        mod.norm.reset_parameters()

    def update(self, mod, prev, out, t, rho):
        return mod.norm(out)
