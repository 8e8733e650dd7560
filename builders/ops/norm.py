"""Normalisations used by the linear-recurrent mixers, in plain PyTorch.

Each function computes what fla's Triton kernel computes: statistics in at least
float32 (float64 stays float64), result cast back to the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_GATE_ACTIVATIONS = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x**2) + eps)`` over the last dim, as fla's ``l2norm`` (not ``F.normalize``)."""
    xf = x.to(_compute_dtype(x))
    return (xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """fla's ``RMSNorm``: ``x / sqrt(mean(x**2) + eps) * weight`` over the last dim."""
    xf = x.to(_compute_dtype(x))
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(y.dtype)
    return y.to(x.dtype)


def rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    activation: str = "swish",
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """Gated RMSNorm over the last dim, optionally in groups of ``group_size`` channels.

    ``norm_before_gate=True`` is fla's ``FusedRMSNormGated``: ``rms(x) * weight * act(gate)``
    (``activation`` in swish/silu/sigmoid). ``norm_before_gate=False`` with swish is the
    Mamba2 ``RMSNormGated``: ``rms(x * silu(gate)) * weight``.
    """
    act = _GATE_ACTIVATIONS[activation]
    dtype = _compute_dtype(x)
    xf, gf = x.to(dtype), act(gate.to(dtype))
    if not norm_before_gate:
        xf = xf * gf
    D = xf.shape[-1]
    group_size = group_size or D
    x_grouped = xf.unflatten(-1, (D // group_size, group_size))  # (..., G, D/G)
    y = (x_grouped * torch.rsqrt(x_grouped.square().mean(-1, keepdim=True) + eps)).flatten(-2)
    if weight is not None:
        y = y * weight.to(dtype)
    if norm_before_gate:
        y = y * gf
    return y.to(x.dtype)
