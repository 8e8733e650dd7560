"""Wall-clock timing on CPU and CUDA: warm-up runs, then the median of repeats; and the
device's measured matmul peak, the denominator of model FLOPs utilisation."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(fn: Callable[[], object], device: torch.device, repeats: int = 3, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - start)
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


__all__ = ["matmul_peak_flops", "median_seconds", "sync", "timings"]
