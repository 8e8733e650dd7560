"""Causal depthwise short convolution (fla's ``ShortConvolution`` / Mamba2 ``conv1d``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_ACTIVATIONS = {None: None, "silu": F.silu, "swish": F.silu}


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """Depthwise causal conv over time: ``y[t, d] = sum_w x[t - W + 1 + w, d] * weight[d, w] + bias[d]``.

    Args:
        x: ``(B, T, D)``.
        weight: ``(D, W)`` or ``nn.Conv1d``'s ``(D, 1, W)``.
        bias: ``(D,)`` or ``None``.
        activation: ``None``, ``"silu"`` or ``"swish"``.

    Returns:
        ``(B, T, D)``; position ``t`` only sees ``x[:t + 1]`` (zero left padding).
    """
    act = _ACTIVATIONS[activation]
    weight_D1W = weight.reshape(weight.shape[0], 1, weight.shape[-1])
    W = weight_D1W.shape[-1]
    x_BDT = F.pad(x.transpose(1, 2), (W - 1, 0))  # (B, D, W - 1 + T)
    y = F.conv1d(x_BDT, weight_D1W, bias, groups=weight_D1W.shape[0]).transpose(1, 2)  # (B, T, D)
    return y if act is None else act(y)
