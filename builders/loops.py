"""Cross-loop machinery of one loop region: update rule, re-injection, conditioning.

Everything that could change a looped model's function starts at the identity where the
papers say so: ρ = 0 (LT2/MixerLoop), conditioning tables = 0 (ELR), so a looped model
starts as plain composition and ``loops=1`` of an ELR model is the plain model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nas.spec import LoopRegion


class LoopExtras(nn.Module):
    """Parameters of one region: ``m`` is the largest loop count it may run."""

    def __init__(self, region: LoopRegion, width: int, m: int):
        super().__init__()
        self.update_kind = region.update.kind
        # a shared ρ lives on the model (one tensor for all regions); see LoopLM
        self.shared_rho = region.update.kind == "residual_gate" and region.update.shared
        if region.update.kind == "residual_gate" and not region.update.shared:
            self.rho = nn.Parameter(torch.zeros(m, width))
        if region.update.kind == "gated_step":
            self.gate = nn.Linear(2 * width, width)
        if region.update.kind == "reinject":
            self.reinject_mode = region.update.mode
            if region.update.mode == "concat":
                self.reinject = nn.Linear(2 * width, width, bias=False)
            elif region.update.mode == "diagonal":
                self.reinject_a = nn.Parameter(torch.zeros(width))
                self.reinject_b = nn.Parameter(torch.full((width,), 0.5))
        if region.conditioning in ("index", "index_budget"):
            self.index_emb = nn.Parameter(torch.zeros(m, width))
        if region.conditioning == "index_budget":
            self.budget_emb = nn.Parameter(torch.zeros(m, width))

    def reset_parameters(self) -> None:
        """Loop-specific initialisation (called after the model's global init)."""
        for name in ("rho", "index_emb", "budget_emb", "reinject_a"):
            if hasattr(self, name):
                nn.init.zeros_(getattr(self, name))
        if hasattr(self, "reinject_b"):
            nn.init.constant_(self.reinject_b, 0.5)
        if hasattr(self, "gate"):
            nn.init.zeros_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)
        if hasattr(self, "reinject"):
            # [I, 0]: at init the concat adapter passes the state through unchanged
            width = self.reinject.out_features
            with torch.no_grad():
                self.reinject.weight.zero_()
                self.reinject.weight[:, :width].copy_(torch.eye(width))

    def conditioning_parameters(self) -> list[nn.Parameter]:
        """The loop-conditioning tables: frozen at zero before an elastic run's switch."""
        return [getattr(self, n) for n in ("index_emb", "budget_emb") if hasattr(self, n)]

    def enter(self, h: torch.Tensor, e: torch.Tensor, t: int, T: int) -> torch.Tensor:
        """State fed to iteration ``t`` of ``T``: re-injection of the region input ``e``
        (from the second iteration on) plus loop conditioning."""
        if self.update_kind == "reinject" and t > 0:
            h = self._reinject(h, e)
        if hasattr(self, "index_emb"):
            h = h + self.index_emb[t]
        if hasattr(self, "budget_emb"):
            h = h + self.budget_emb[T - 1]
        return h

    def _reinject(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        if self.reinject_mode == "add":
            return h + e
        if self.reinject_mode == "concat":
            return self.reinject(torch.cat([h, e], dim=-1))
        a = torch.exp(-F.softplus(self.reinject_a))  # (D,) in (0, 1): a contraction
        return a * h + self.reinject_b * e

    def update(self, prev: torch.Tensor, out: torch.Tensor, t: int,
               shared_rho: torch.Tensor | None) -> torch.Tensor:
        """Combine iteration ``t``'s output with the state before it."""
        if self.update_kind == "residual_gate":
            rho = shared_rho if self.shared_rho else self.rho
            return out + rho[t] * prev
        if self.update_kind == "gated_step" and t > 0:
            g = torch.sigmoid(self.gate(torch.cat([prev, out], dim=-1)))  # (B, T, D)
            return prev + g * (out - prev)
        return out


__all__ = ["LoopExtras"]
