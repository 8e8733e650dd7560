"""ELR: ``index_emb[t]`` (+ ``budget_emb[k − 1]``) added to the state entering iteration t
of k; zero-initialised, so a trained one-loop model is unchanged by it."""
import torch
from torch import nn

from . import LoopRule, register


@register("conditioning")
class Conditioning(LoopRule):
    def build(self, mod, r, width, m):
        mod.index_emb = nn.Parameter(torch.zeros(m, width))
        if r.conditioning == "index_budget":
            mod.budget_emb = nn.Parameter(torch.zeros(m, width))

    def reset(self, mod):
        for p in self.conditioning(mod):
            nn.init.zeros_(p)

    def enter(self, mod, h, e, t, T):
        h = h + mod.index_emb[t]
        return h + mod.budget_emb[T - 1] if hasattr(mod, "budget_emb") else h

    def conditioning(self, mod):
        return [getattr(mod, n) for n in ("index_emb", "budget_emb") if hasattr(mod, n)]
