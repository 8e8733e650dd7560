"""Model FLOPs utilisation of a training step: the cost model's training FLOPs per token
(:func:`nas.cost.train_flops_at`: forward plus a backward of twice the forward, a truncated
region's backward through its last ``truncate`` iterations only) × tokens per second, over a
matmul rate measured in the same process. On CUDA the rate is the device's large square
matmul; on CPU it is the model's own training matmuls at its batch × context, since small
shapes run far below a square matmul there.
``loopnas bench`` and ``benchmarks/bench_proxy.py`` both report this figure."""
from __future__ import annotations

import time
from typing import Callable

import torch

from .timing import matmul_peak_flops, matmul_shapes, training_matmul_flops


def matmul_rate(model: torch.nn.Module, rows: int, dtype: torch.dtype = torch.float32,
                clock: Callable[[], float] = time.perf_counter, peak: float | None = None) -> float:
    """FLOP/s that MFU divides by for ``model`` training on ``rows`` tokens per step: on CPU
    :func:`training_matmul_flops` of its weights' shapes, timed by ``clock``; on CUDA the
    square-matmul ``peak`` (measured now when not given)."""
    device = model.embed.weight.device
    if device.type == "cuda":
        return peak or matmul_peak_flops(device, dtype)
    return training_matmul_flops(matmul_shapes(model), rows, device, dtype, clock=clock)


def model_flops(arch, seq_len: int, tokens_per_s: float, loops: int | None = None) -> float:
    """Model FLOP/s of training ``arch`` at ``tokens_per_s`` on ``seq_len``-token sequences,
    every loop region run ``loops`` times (None: its T)."""
    from nas.cost import train_flops_at

    return tokens_per_s * train_flops_at(arch, loops, seq_len)


__all__ = ["matmul_rate", "model_flops"]
