"""Helpers for benchmarks that compare architectures in one process: spec variants of a
shipped architecture, and timings interleaved across models (round robin), so load drift
on a shared machine hits every model alike and a ratio of two medians is fair."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from .measure import DECODE_WARMUP, random_ids
from .timing import sync


def variant(name: str, new_name: str | None = None, **edits: Any):
    """A shipped architecture (``spaces/archs/NAME.yaml``) with top-level fields of its
    user-level spec replaced (``layer={...}``, ``kv_policy="per_loop"``, ``loop=...``),
    lowered to canonical form."""
    from nas.load import parse_yaml, resolve, spec_from_dict
    from spaces import arch_path

    path = arch_path(name)
    if path is None:
        raise ValueError(f"no shipped architecture {name!r}")
    data = parse_yaml(path.read_text(), str(path))
    data.update(edits, name=new_name or name)
    return resolve(spec_from_dict(data, new_name or name))


def with_mixer(name: str, mixer: dict[str, Any], new_name: str | None = None):
    """The shipped ``name`` with every layer's mixer replaced by ``mixer`` (its FFN kept)."""
    from nas.load import parse_yaml
    from spaces import arch_path

    layer = dict(parse_yaml(arch_path(name).read_text())["layer"], mixer=mixer)
    return variant(name, new_name or f"{name}_{mixer['kind']}", layer=layer)


def round_robin(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int = 5,
                warmup: int = 1) -> dict[str, float]:
    """Median seconds of each function, called in turn ``warmup + repeats`` times."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


@torch.inference_mode()
def interleaved_decode(models: dict[str, Any], batch_size: int, context: int, steps: int,
                       loops: int | None = None) -> dict[str, dict[str, float]]:
    """Prefill every model with the same ``context`` random tokens, then decode ``steps``
    tokens, one step of each model in turn (the first ``DECODE_WARMUP`` untimed). Per model:
    median ms per step, tokens/s over the batch, and the cache bytes after the prefill."""
    first = next(iter(models.values()))
    device = first.embed.weight.device
    ids = random_ids(first, batch_size, context)
    caches, held = {}, {}
    for name, model in models.items():
        _, caches[name] = model.eval().prefill(ids, loops=loops)
        held[name] = dict(caches[name].nbytes())
    step_ids = random_ids(first, batch_size, DECODE_WARMUP + steps, seed=3)
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(DECODE_WARMUP + steps):
        for name, model in models.items():
            sync(device)
            start = time.perf_counter()
            model.decode(caches[name], step_ids[:, i:i + 1])
            sync(device)
            if i >= DECODE_WARMUP:
                times[name].append(time.perf_counter() - start)
    out = {}
    for name, ts in times.items():
        ms = 1e3 * statistics.median(ts)
        out[name] = {"ms_per_token": ms, "tokens_per_s": 1e3 * batch_size / ms,
                     "kv_bytes": held[name]["kv"], "state_bytes": held[name]["state"]}
    return out


def markdown(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured markdown table."""
    def cell(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
        return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(detail: str) -> str:
    """The line a committed result starts with: the exact command, then the date, machine,
    its load at the end (a shared CPU slows everything), torch, and ``detail``."""
    import datetime
    import os
    import platform
    import sys

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"`python {' '.join(sys.argv)}`\n\n{datetime.date.today()}, {platform.machine()} "
            f"{os.cpu_count()}-core CPU (load average {load:.1f} at the end), torch {torch.__version__}, "
            f"{detail}\n\n")


def write_markdown(path: str, title: str, table: str, notes: str = "", timed: bool = True) -> None:
    """The table with the exact command that produced it and where it ran."""
    import platform
    import sys
    import time

    command = "python " + " ".join(sys.argv)
    with open(path, "w") as f:
        f.write(f"# {title}\n\n`{command}`\n\n{time.strftime('%Y-%m-%d')}, {platform.machine()} "
                f"CPU, torch {torch.__version__}, "
                f"{torch.get_num_threads()} thread(s)."
                + (" Ratios are of medians measured in one process, the models interleaved."
                   if timed else "") + f"\n\n{table}\n{notes}")


__all__ = ["interleaved_decode", "markdown", "provenance", "round_robin", "variant", "with_mixer", "write_markdown"]
