"""``bench``: every measurement of one spec over a grid of (batch size, context), in one
process, plus the device's measured matmul peak and the largest context that fits.

Per grid point: the serving peak memory (which also warms the kernels up), prefill and
decode throughput with the cache size, and a training step's throughput, peak memory and
model FLOPs utilisation (:mod:`.mfu`: the cost model's training FLOPs over a matmul rate
timed in this process, the model's own training matmuls at batch × context on CPU, the
square-matmul peak on CUDA). A grid point that runs out of memory is recorded as such and
the grid goes on.
"""
from __future__ import annotations

import platform

import torch
from pydantic import BaseModel, Field

from nas.spec import ArchSpec

from .measure import ContextLimit, for_serving, max_context, measure_serving, measure_train, serving_peak
from .memory import CPU_METHOD, CUDA_METHOD
from .mfu import matmul_rate, model_flops
from .timing import matmul_peak_flops

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class BenchRow(BaseModel):
    """One (batch size, context). Throughputs count tokens over the whole batch; the
    ``cost_*`` bytes are the cost model's per-sequence figures times the batch."""

    context: int
    batch_size: int
    train_tokens_per_s: float | None = None
    train_step_ms: float | None = None
    train_mfu: float | None = None
    matmul_flops: float | None = Field(None, description="FLOP/s train_mfu divides by: the model's own "
                                       "training matmuls at batch × context (CPU), the square-matmul "
                                       "peak (CUDA); runners.bench.mfu")
    train_peak_memory_bytes: int | None = None
    prefill_tokens_per_s: float | None = None
    prefill_ms: float | None = None
    decode_tokens_per_s: float | None = None
    decode_ms_per_token: float | None = None
    peak_memory_bytes: int | None = Field(None, description="prefill + decode")
    cache_kv_bytes: int | None = None
    cache_state_bytes: int | None = None
    cost_kv_bytes: int | None = None
    cost_state_bytes: int | None = None
    error: str | None = None


class BenchResult(BaseModel):
    spec: str
    device: str
    device_name: str
    backend: str
    serving_backend: str | None = Field(description="the backend prefill and decode ran on (torch "
                                        "where the model's own cannot decode); None: no decoding")
    dtype: str
    loops: int | None
    torch: str
    threads: int
    repeats: int
    decode_tokens: int
    memory_method: str
    peak_flops: float = Field(description="FLOP/s of a large square matmul in dtype, measured in this "
                              "process (CUDA's MFU denominator)")
    rows: list[BenchRow]
    limits: list[dict] = Field(default_factory=list, description="largest context that fits, per batch size")
    memory_limit: int | None = None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _guarded(fn, device: torch.device) -> tuple[dict, str | None]:
    """``fn()``'s fields, or none and why: out of memory, or a model that cannot decode."""
    try:
        return fn(), None
    except NotImplementedError as exc:
        return {}, f"no incremental decoding: {exc}"
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not _oom(exc):
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {}, "out of memory"


def measure_point(model, serving_model, arch: ArchSpec, batch_size: int, context: int, *,
                  dtype: torch.dtype, dtype_name: str, decode_tokens: int, loops: int | None,
                  repeats: int, peak_flops: float) -> BenchRow:
    from nas.cost import figures_at

    figures = figures_at(arch, loops, seq_len=context, dtype=dtype_name)
    device = model.embed.weight.device

    def serve() -> dict:
        peak = serving_peak(serving_model, batch_size, context, loops)
        s = measure_serving(serving_model, batch_size, context, decode_tokens, loops, repeats)
        return {"peak_memory_bytes": peak.bytes, **s.__dict__}

    def train() -> dict:
        t = measure_train(model, batch_size, context, dtype, loops, repeats)
        rate = matmul_rate(model, batch_size * context, dtype, peak=peak_flops)
        return {"train_tokens_per_s": t.tokens_per_s, "train_step_ms": t.step_ms,
                "train_peak_memory_bytes": t.peak.bytes, "matmul_flops": rate,
                "train_mfu": model_flops(arch, context, t.tokens_per_s, loops) / rate}

    served, why = _guarded(serve, device)
    trained, why_train = _guarded(train, device)
    errors = [f"{what}: {e}" for what, e in (("serving", why), ("training", why_train)) if e]
    return BenchRow(context=context, batch_size=batch_size, **served, **trained,
                    cost_kv_bytes=figures.kv_cache_bytes * batch_size,
                    cost_state_bytes=figures.state_bytes * batch_size,
                    error="; ".join(errors) or None)


def bench(arch: ArchSpec, contexts: list[int], batch_sizes: list[int], *, device: str = "cpu",
          backend: str = "auto", dtype: str | None = None, decode_tokens: int = 16,
          repeats: int = 3, loops: int | None = None, memory_limit: int | None = None,
          max_context_len: int | None = None, search: bool = True, seed: int = 0) -> BenchResult:
    """Measure ``arch`` (canonical) at every (batch size, context); see the module docstring.
    ``dtype``: fp32 or bf16 (default: bf16 on CUDA, fp32 on CPU). ``search``: also find,
    per batch size, the largest context that fits (doubling from the smallest context, up
    to ``max_context_len``; against ``memory_limit`` bytes of measured peak when given,
    else, on CUDA, the device's real out-of-memory)."""
    from builders.model import build_model

    dev = torch.device(device)
    dtype = dtype or ("bf16" if dev.type == "cuda" else "fp32")
    torch.manual_seed(seed)
    model = build_model(arch, backend=backend, device=dev)
    try:
        serving_model, serving_backend = for_serving(model, DTYPES[dtype])
    except NotImplementedError:  # a mixer that cannot decode: every serving row says so
        serving_model, serving_backend = model.eval(), None
    peak_flops = matmul_peak_flops(dev, DTYPES[dtype])
    rows = [measure_point(model, serving_model, arch, b, c, dtype=DTYPES[dtype], dtype_name=dtype,
                          decode_tokens=decode_tokens, loops=loops, repeats=repeats, peak_flops=peak_flops)
            for b in batch_sizes for c in contexts]
    limits: list[ContextLimit] = []
    if search and serving_backend is not None and (memory_limit is not None or dev.type == "cuda"):
        top = max_context_len or (1 << 20)
        limits = [max_context(serving_model, b, min(contexts), top, memory_limit, loops) for b in batch_sizes]
    return BenchResult(
        spec=arch.name, device=str(dev), device_name=device_name(dev), backend=model.backend,
        serving_backend=serving_backend,
        dtype=dtype, loops=loops, torch=torch.__version__, threads=torch.get_num_threads(),
        repeats=repeats, decode_tokens=decode_tokens,
        memory_method=CUDA_METHOD if dev.type == "cuda" else CPU_METHOD, peak_flops=peak_flops,
        rows=rows, limits=[l.__dict__ for l in limits], memory_limit=memory_limit)


__all__ = ["BenchResult", "BenchRow", "DTYPES", "bench", "measure_point"]
