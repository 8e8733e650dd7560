"""Wall-clock timing on CPU and CUDA: warm-up runs, then the median of repeats; and the
measured matmul rates that model FLOPs utilisation divides by: a large square matmul (the
device's peak, CUDA) and the model's own training matmuls at its batch × context (CPU,
where small shapes run far below the square peak)."""
from __future__ import annotations

import collections
import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(fn: Callable[[], object], device: torch.device, repeats: int = 3, warmup: int = 1,
            clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, by
    ``clock`` (wall time; ``time.process_time`` counts only this process's CPU time, which
    other jobs on a shared CPU do not inflate)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        sync(device)
        start = clock()
        fn()
        sync(device)
        out.append(clock() - start)
    return out


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 3, warmup: int = 1) -> float:
    return statistics.median(timings(fn, device, repeats, warmup))


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int | None = None,
                      repeats: int = 5) -> float:
    """FLOP/s of an ``n × n`` matmul (2n³ FLOPs) in ``dtype``: the best the device does on
    dense work in this process, under this load (n = 8192 on CUDA, 512 on CPU)."""
    n = n or (8192 if device.type == "cuda" else 512)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    best = min(timings(lambda: a @ b, device, repeats=repeats, warmup=2))
    return 2 * n**3 / best


def matmul_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """``(in, out)`` of every weight a token is multiplied by: each ``nn.Linear``, and the
    LM head when it is the tied embedding (an untied ``lm_head`` is a Linear already)."""
    shapes = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    embed = getattr(model, "embed", None)
    if embed is not None and not hasattr(model, "lm_head"):
        shapes.append((embed.weight.shape[1], embed.weight.shape[0]))
    return shapes


def training_matmul_flops(shapes: list[tuple[int, int]], rows: int, device: torch.device,
                          dtype: torch.dtype = torch.float32, repeats: int = 5,
                          clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of the training matmuls of weights ``shapes`` applied to ``rows`` tokens: per
    weight ``(in, out)`` the forward ``x W^T``, the input gradient ``dy W`` and the weight
    gradient ``dy^T x``, ``6 · rows · in · out`` FLOPs, each timed at its best of
    ``repeats``. Total FLOPs over total time: what the model's projections could reach if
    nothing else ran."""
    gen = torch.Generator(device=device).manual_seed(0)
    flops = seconds = 0.0
    for (n_in, n_out), count in collections.Counter(shapes).items():
        x, dy, w = (torch.randn(*s, device=device, dtype=dtype, generator=gen)
                    for s in ((rows, n_in), (rows, n_out), (n_out, n_in)))
        best = min(timings(lambda: (x @ w.T, dy @ w, dy.T @ x), device, repeats, 2, clock))
        flops, seconds = flops + count * 6 * rows * n_in * n_out, seconds + count * best
    return flops / seconds


__all__ = ["matmul_peak_flops", "matmul_shapes", "median_seconds", "sync", "timings", "training_matmul_flops"]
