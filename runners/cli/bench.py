"""``loopnas bench SPEC``: measured training, prefill and decode throughput, peak memory,
cache bytes beside the cost model's, and the largest context that fits."""
from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from . import app
from .common import JsonOpt, OutOpt, SpecArg, UsageError, console, load


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Backend(str, Enum):
    auto = "auto"
    torch = "torch"
    fla = "fla"


class Dtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
CPU_CONTEXTS, CUDA_CONTEXTS = "128,256,512", "1024,2048,4096,8192,16384,32768"
CPU_MEMORY_LIMIT = 16 << 20
literal = Console(soft_wrap=True, markup=False)  # the tables hold a spec name, a device name, an error text


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated positive integers, e.g. 128,256") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} {text!r}: expected comma-separated positive integers, e.g. 128,256")
    return values


def byte_size(text: str) -> int:
    """``64MiB``, ``2GB``, ``1e9`` → bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    unit = m and m.group(2).lower()
    try:
        value = float(m.group(1)) * _UNITS[unit] if m else -1
    except (ValueError, KeyError):
        value = -1
    if value <= 0:
        raise UsageError(f"--memory-limit {text!r}: expected a size such as 64MiB, 2GB or 1e9")
    return int(value)


@app.command("bench")
def bench_cmd(
    spec: SpecArg,
    contexts: Annotated[str | None, typer.Option("--contexts", help=f"Context lengths (default {CPU_CONTEXTS} on CPU, {CUDA_CONTEXTS} on CUDA).", show_default=False)] = None,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="Batch sizes.")] = "1,4",
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Decode steps timed after each prefill (median).", min=1)] = 16,
    device: Annotated[Device, typer.Option("--device", help="Where to measure.")] = Device.cpu,
    backend: Annotated[Backend, typer.Option("--backend", help="auto: fla on CUDA when it runs, else torch.")] = Backend.auto,
    dtype: Annotated[Dtype | None, typer.Option("--dtype", help="Weights and cache for inference, autocast for training (default bf16 on CUDA, fp32 on CPU).", show_default=False)] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed repeats after one warm-up (median).", min=1)] = 3,
    memory_limit: Annotated[str | None, typer.Option("--memory-limit", help="Largest-context search: stop when the measured peak exceeds this (default 16MiB on CPU; on CUDA the real out-of-memory).", show_default=False)] = None,
    max_context: Annotated[int | None, typer.Option("--max-context", help="Largest-context search: give up above this (default 65536 on CPU, 1048576 on CUDA).", min=1, show_default=False)] = None,
    loops: Annotated[int | None, typer.Option("--loops", help="Run every loop region this many times (elastic depth; default: each region's T).", show_default=False)] = None,
    out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure SPEC: training throughput (and MFU against a matmul timed in the same
    process), prefill and decode throughput against context and batch size, peak memory,
    the cache's bytes beside the cost model's, and the largest context that fits. Writes
    OUT/bench.json and OUT/bench.png (default out: runs/bench/<spec name>).

    Examples:
      loopnas bench tiny_mixerloop
      loopnas bench tiny_lt2_interleave --contexts 256,1024,4096 --batch-sizes 1 --memory-limit 32MiB
      loopnas bench tiny_elr --loops 2
      loopnas bench mixerloop_110m --device cuda --batch-sizes 1,8 --out runs/bench/ml110
    """
    ctx = int_list(contexts or (CUDA_CONTEXTS if device is Device.cuda else CPU_CONTEXTS), "--contexts")
    batches = int_list(batch_sizes, "--batch-sizes")
    limit = byte_size(memory_limit) if memory_limit is not None else (
        CPU_MEMORY_LIMIT if device is Device.cpu else None)
    arch = load(spec)
    from nas.plan import loop_count_problem
    if (problem := loop_count_problem(arch, loops)) is not None:
        raise UsageError(f"--loops: {problem}")

    import torch

    from runners.bench import bench
    from runners.bench.output import limits_table, memory_table, table, write

    if device is Device.cuda and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available here")
    result = bench(arch, ctx, batches, device=device.value, backend=backend.value,
                   dtype=dtype.value if dtype else None, decode_tokens=decode_tokens, repeats=repeats,
                   memory_limit=limit, max_context_len=max_context or (1 << 16 if device is Device.cpu else 1 << 20),
                   loops=loops)
    json_path, png_path = write(result, out or Path("runs") / "bench" / arch.name)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    literal.print(table(result))
    literal.print(memory_table(result))
    for r in result.rows:
        if r.error:
            console.print(f"batch {r.batch_size}, context {r.context}: {r.error}", highlight=False, markup=False)
    if result.limits:
        literal.print(limits_table(result))
    rate = ("the model's own training matmuls at batch × context, timed here" if result.device == "cpu"
            else f"a square matmul's peak, {result.peak_flops / 1e9:.4g} GFLOP/s")
    console.print(f"peak memory: {result.memory_method}; MFU: the cost model's training FLOPs over "
                  f"{rate} ({result.dtype})", highlight=False, markup=False)
    console.print(f"wrote {json_path} and {png_path}", highlight=False, markup=False)
