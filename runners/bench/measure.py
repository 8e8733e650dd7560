"""The measurements, each on one model at one (batch size, context): training step,
prefill, decode, cache bytes, peak memory, and the largest context that fits.

Every function takes a built :class:`builders.model.LoopLM` already on its device.
Inference runs under ``torch.inference_mode`` in the model's own dtype; a training step is
forward + backward + clip + AdamW step with the trainer's parameter groups, under bf16
autocast when ``dtype`` is bfloat16 (as the proxy trainer runs on CUDA).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch

from .memory import Peak, module_bytes, peak_memory, tensor_bytes
from .timing import median_seconds, sync

DECODE_WARMUP = 2


def random_ids(model, batch_size: int, length: int, seed: int = 0) -> torch.Tensor:
    device = model.embed.weight.device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.arch.model.vocab_size, (batch_size, length), generator=gen)
    return ids.to(device)


def _device(model) -> torch.device:
    return model.embed.weight.device


def _autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@dataclass(frozen=True)
class TrainTiming:
    tokens_per_s: float
    step_ms: float
    peak: Peak


def train_step(model, batch_size: int, context: int, dtype: torch.dtype = torch.float32,
               loops: int | None = None):
    """(a closure running one optimizer step on fixed random tokens, its optimizer, the
    bytes of its inputs)."""
    from runners.train import param_groups

    device = _device(model)
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, fused=device.type == "cuda" or None)
    x = random_ids(model, batch_size, context, seed=1)
    y = random_ids(model, batch_size, context, seed=2)

    def step():
        with _autocast(device, dtype):
            loss = model(x, y, loops=loops).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step, optimizer, tensor_bytes([x, y])


def measure_train(model, batch_size: int, context: int, dtype: torch.dtype = torch.float32,
                  loops: int | None = None, repeats: int = 3, warmup: int = 1) -> TrainTiming:
    """Training throughput (tokens/s over the batch) and the peak memory of one step."""
    device = _device(model)
    model.train()
    step, optimizer, inputs = train_step(model, batch_size, context, dtype, loops)
    step()  # AdamW allocates its state on the first step: not part of the steady state
    _, peak = peak_memory(step, device, baseline=module_bytes(model, optimizer) + inputs)
    seconds = median_seconds(step, device, repeats, warmup)
    model.eval()
    return TrainTiming(batch_size * context / seconds, 1e3 * seconds, peak)


def for_serving(model, dtype: torch.dtype):
    """``model`` in its serving dtype, ready to decode: a copy when the dtype differs, and its
    torch-backend twin (same weights: the parameter names match) when its backend cannot
    decode incrementally (fla's layers). Returns (model, the backend it runs)."""
    import copy

    from builders.model import build_model

    served = model.eval() if model.embed.weight.dtype == dtype else copy.deepcopy(model).to(dtype).eval()
    try:
        with torch.inference_mode():
            served.prefill(random_ids(served, 1, 2))
        return served, served.backend
    except NotImplementedError:
        if served.backend == "torch":
            raise
    twin = build_model(model.arch, backend="torch", device=_device(model))
    twin.load_state_dict(model.state_dict())
    return twin.to(dtype).eval(), "torch"


@dataclass(frozen=True)
class Serving:
    """One (batch size, context): prefill and decode throughput, the cache it holds."""

    prefill_tokens_per_s: float
    prefill_ms: float
    decode_tokens_per_s: float
    decode_ms_per_token: float
    cache_kv_bytes: int
    cache_state_bytes: int


@torch.inference_mode()
def measure_prefill(model, batch_size: int, context: int, loops: int | None = None,
                    repeats: int = 3, warmup: int = 1) -> tuple[float, float]:
    """(tokens/s, ms) of a prefill of ``context`` tokens: the cache built and returned."""
    ids = random_ids(model, batch_size, context)
    seconds = median_seconds(lambda: model.prefill(ids, loops=loops), _device(model), repeats, warmup)
    return batch_size * context / seconds, 1e3 * seconds


@torch.inference_mode()
def measure_decode(model, batch_size: int, context: int, tokens: int, loops: int | None = None
                   ) -> tuple[float, float, dict[str, int]]:
    """After a ``context``-token prefill, decode ``tokens`` tokens one at a time (the first
    ``DECODE_WARMUP`` untimed): (tokens/s over the batch, ms per step, cache bytes after
    the prefill)."""
    device = _device(model)
    _, cache = model.prefill(random_ids(model, batch_size, context), loops=loops)
    held = dict(cache.nbytes())
    step_ids = random_ids(model, batch_size, DECODE_WARMUP + tokens, seed=3)
    times = []
    for i in range(DECODE_WARMUP + tokens):
        sync(device)
        start = time.perf_counter()
        model.decode(cache, step_ids[:, i:i + 1])
        sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[DECODE_WARMUP:])
    return batch_size / seconds, 1e3 * seconds, held


def measure_serving(model, batch_size: int, context: int, decode_tokens: int, loops: int | None = None,
                    repeats: int = 3, warmup: int = 1) -> Serving:
    model.eval()
    prefill_tps, prefill_ms = measure_prefill(model, batch_size, context, loops, repeats, warmup)
    decode_tps, decode_ms, held = measure_decode(model, batch_size, context, decode_tokens, loops)
    return Serving(prefill_tps, prefill_ms, decode_tps, decode_ms, held["kv"], held["state"])


def serving_peak(model, batch_size: int, context: int, loops: int | None = None,
                 decode_tokens: int = 2) -> Peak:
    """Peak memory of a ``context``-token prefill followed by ``decode_tokens`` decode steps."""
    model.eval()
    ids = random_ids(model, batch_size, context)
    step_ids = random_ids(model, batch_size, decode_tokens, seed=3)

    @torch.inference_mode()
    def serve():
        _, cache = model.prefill(ids, loops=loops)
        for i in range(decode_tokens):
            model.decode(cache, step_ids[:, i:i + 1])
    return peak_memory(serve, _device(model), baseline=module_bytes(model) + tensor_bytes([ids, step_ids]))[1]


@dataclass(frozen=True)
class ContextLimit:
    """The largest context of a doubling search that fits (None: not even the first),
    the first that did not (None: the search reached ``max_context``) and why."""

    batch_size: int
    fits: int | None
    fails: int | None
    peak_at_fit: int | None
    reason: str


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.3g} MiB"


def max_context(model, batch_size: int, start: int, max_context: int, limit: int | None,
                loops: int | None = None) -> ContextLimit:
    """Double the context from ``start`` while a prefill + decode fits: on CUDA until a real
    out-of-memory error (or ``limit`` bytes of measured peak, if given); on CPU until the
    measured peak exceeds ``limit``. Each step at most doubles the context, so a run never
    asks for much more than the limit (4× for memory quadratic in context)."""
    device = _device(model)
    fits = peak_at_fit = None
    context = start
    while context <= max_context:
        try:
            peak = serving_peak(model, batch_size, context, loops).bytes
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not _is_oom(exc):
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return ContextLimit(batch_size, fits, context, peak_at_fit, "out of memory")
        if limit is not None and peak > limit:
            return ContextLimit(batch_size, fits, context, peak_at_fit,
                                f"measured peak {_mib(peak)} exceeds the limit {_mib(limit)}")
        fits, peak_at_fit = context, peak
        context *= 2
    return ContextLimit(batch_size, fits, None, peak_at_fit, f"reached --max-context {max_context}")


__all__ = ["ContextLimit", "Serving", "TrainTiming", "for_serving", "max_context", "measure_decode", "measure_prefill",
           "measure_serving", "measure_train", "random_ids", "serving_peak", "train_step"]
