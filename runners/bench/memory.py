"""Peak memory of a region of code, measured, on CUDA and on CPU.

CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak: every byte the caching
allocator handed out, live tensors from before the region included.

CPU: torch has no allocator statistics, and ``tracemalloc`` does not see tensor storage.
The region runs under torch's (legacy, fast-starting) autograd profiler with
``profile_memory=True``, which records every allocation and free of torch's CPU allocator;
the running sum of those events in time order gives the peak above the bytes live when the
region began, and ``baseline`` (the caller's live tensors: weights,
gradients, optimizer state, inputs, cache) is added to it, so the figure has the same
meaning as the CUDA one. Every tensor is seen, op outputs, activations, caches and an op's
scratch tensors alike; memory a kernel takes from ``malloc`` directly is not. A block
allocated before the region and freed inside it has no recorded size (torch warns once), so
its free is not subtracted: the figure can err high by such blocks, never low.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

CPU_METHOD = ("torch profiler memory events (every CPU-allocator allocation and free, running sum "
              "in time order) + bytes of tensors live before")
CUDA_METHOD = "torch.cuda.max_memory_allocated"


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct storages among ``tensors`` (views are counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def module_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Parameters, buffers, gradients and optimizer state."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values()]
    return tensor_bytes(tensors)


@dataclass(frozen=True)
class Peak:
    bytes: int
    method: str


def _cpu_peak(records) -> int:
    """Highest running sum of the CPU allocator's allocations and frees, in time order."""
    start = next(r for thread in records for r in thread if r.name() == "__start_profile")
    deltas = sorted((start.cpu_elapsed_us(r), i, r.cpu_memory_usage())
                    for thread in records for i, r in enumerate(thread) if r.kind() == "memory_alloc")
    total = peak = 0
    for _, _, delta in deltas:
        total += delta
        peak = max(peak, total)
    return peak


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto writes a line to fd 2 whenever a profiler starts or stops."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def peak_memory(fn: Callable[[], object], device: torch.device, baseline: int = 0) -> tuple[object, Peak]:
    """Run ``fn()`` once and return (its result, its peak memory). ``baseline``: bytes of
    live tensors the CPU measurement cannot see (the CUDA one sees them itself)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, Peak(int(torch.cuda.max_memory_allocated(device)), CUDA_METHOD)
    # The raw event records: the profiler's own exit builds an event tree, ~1 s per 16k ops.
    from torch.autograd import _disable_profiler_legacy, _enable_profiler_legacy, profiler_legacy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy profiler announces its deprecation
        config = profiler_legacy.profile(profile_memory=True).config()
    with _quiet_stderr():
        _enable_profiler_legacy(config)
    try:
        out = fn()
    finally:
        with _quiet_stderr():
            records = _disable_profiler_legacy()
    return out, Peak(baseline + _cpu_peak(records), CPU_METHOD)


__all__ = ["CPU_METHOD", "CUDA_METHOD", "Peak", "module_bytes", "peak_memory", "tensor_bytes"]
