"""Causal depthwise short convolution (fla's ``ShortConvolution`` / Mamba2 ``conv1d``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from builders import fast

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
    if x.device.type == "cpu" and fast.enabled():
        # oneDNN's depthwise conv costs several times the shifted sums at the proxies' shapes
        y = _ShiftedConv.apply(x, weight.reshape(weight.shape[0], -1).to(x.dtype))
        y = y if bias is None else y + bias.to(y.dtype)
    else:
        weight_D1W = weight.reshape(weight.shape[0], 1, weight.shape[-1])
        W = weight_D1W.shape[-1]
        x_BDT = F.pad(x.transpose(1, 2), (W - 1, 0))  # (B, D, W - 1 + T)
        y = F.conv1d(x_BDT, weight_D1W, bias, groups=weight_D1W.shape[0]).transpose(1, 2)  # (B, T, D)
    return y if act is None else act(y)


def _shifted_sum(x_pad: torch.Tensor, weight_DW: torch.Tensor, T: int, reverse: bool = False) -> torch.Tensor:
    """``sum_w x_pad[:, w : w + T] * weight[:, w]`` (taps reversed: the transposed conv)."""
    W = weight_DW.shape[-1]
    taps = [W - 1 - w for w in range(W)] if reverse else list(range(W))
    y = x_pad[:, taps[0]:taps[0] + T] * weight_DW[:, 0]
    for w in range(1, W):
        y.addcmul_(x_pad[:, taps[w]:taps[w] + T], weight_DW[:, w])
    return y


class _ShiftedConv(torch.autograd.Function):
    """Causal depthwise conv ``(B, T, D), (D, W) -> (B, T, D)`` as W shifted multiply-adds,
    forward and backward (the input gradient is the same sum over the taps reversed)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight_DW: torch.Tensor) -> torch.Tensor:
        W, T = weight_DW.shape[-1], x.shape[1]
        x_pad = F.pad(x, (0, 0, W - 1, 0))  # (B, W - 1 + T, D)
        ctx.save_for_backward(x_pad, weight_DW)
        return _shifted_sum(x_pad, weight_DW, T)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_pad, weight_DW = ctx.saved_tensors
        W, T = weight_DW.shape[-1], grad.shape[1]
        grad = grad.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = _shifted_sum(F.pad(grad, (0, 0, 0, W - 1)), weight_DW, T, reverse=True)
        if ctx.needs_input_grad[1]:
            grad_w = torch.stack([(grad * x_pad[:, w:w + T]).sum((0, 1)) for w in range(W)], -1)
        return grad_x, grad_w
