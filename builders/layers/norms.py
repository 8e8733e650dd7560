"""Norms the DSL names beyond torch's own ``nn.RMSNorm`` and ``nn.LayerNorm``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ZeroCenteredRMSNorm"]


class ZeroCenteredRMSNorm(nn.Module):
    """``rms(x) · (1 + weight)``, ``weight`` starting at 0 (Qwen3-Next's ``Qwen3NextRMSNorm``):
    statistics and scale in at least float32 (float64 stays float64), the result cast back
    to the input dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(dtype)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.to(dtype))).type_as(x)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
