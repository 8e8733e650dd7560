"""What ``loopnas bench`` shows: a rich table, a PNG of throughput against context, JSON."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from nas.units import nbytes, si
from runners.checkpoint import save_figure, write_text

from .run import BenchResult

PLOTTED = (("train_tokens_per_s", "training"), ("prefill_tokens_per_s", "prefill"),
           ("decode_tokens_per_s", "decode"))




def table(result: BenchResult) -> Table:
    """Throughput: tokens/s over the batch; MFU against a matmul rate measured in the process
    (:mod:`.mfu`)."""
    t = Table(title=f"{result.spec}: tokens/s on {result.device} ({result.device_name}), {result.dtype}, "
                    f"backend {result.backend}"
                    + (f" (serving: {result.serving_backend})" if result.serving_backend not in (None, result.backend) else "")
                    + f"; median of {result.repeats}, decode over "
                    f"{result.decode_tokens} tokens")
    for col in ("batch", "context", "train", "MFU", "prefill", "decode", "ms/token"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in result.rows:
        t.add_row(str(r.batch_size), str(r.context), si(r.train_tokens_per_s, digits=3),
                  "—" if r.train_mfu is None else f"{100 * r.train_mfu:.2g}%",
                  si(r.prefill_tokens_per_s, digits=3), si(r.decode_tokens_per_s, digits=3),
                  "—" if r.decode_ms_per_token is None else f"{r.decode_ms_per_token:.3g}")
    return t


def memory_table(result: BenchResult) -> Table:
    """Peak memory of serving (prefill + decode) and of a training step; the cache after the
    prefill, measured and as the cost model prices it."""
    t = Table(title="memory: measured peaks; cache bytes after the prefill, measured vs cost model")
    for col in ("batch", "context", "serving peak", "training peak", "cache", "cost model"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in result.rows:
        cache = None if r.cache_kv_bytes is None else r.cache_kv_bytes + r.cache_state_bytes
        t.add_row(str(r.batch_size), str(r.context), nbytes(r.peak_memory_bytes, digits=3),
                  nbytes(r.train_peak_memory_bytes, digits=3), nbytes(cache, digits=3),
                  nbytes(r.cost_kv_bytes + r.cost_state_bytes, digits=3))
    return t


def limits_table(result: BenchResult) -> Table:
    limit = "the device's memory" if result.memory_limit is None else nbytes(result.memory_limit, digits=3)
    t = Table(title=f"largest context that fits (prefill + decode, doubling; limit: {limit})")
    for col in ("batch", "fits", "peak there", "fails at", "why it stopped"):
        t.add_column(col, justify="left" if col == "why it stopped" else "right",
                     no_wrap=col != "why it stopped")
    for l in result.limits:
        t.add_row(str(l["batch_size"]), str(l["fits"] or "none"), nbytes(l["peak_at_fit"], digits=3),
                  str(l["fails"] or "—"), l["reason"])
    return t


def plot(result: BenchResult, path: Path) -> Path:
    """Throughput (tokens/s) against context: one panel per phase, one line per batch size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4.2 * len(PLOTTED), 3.6), constrained_layout=True)
    for ax, (field, title) in zip(axes, PLOTTED):
        for b in sorted({r.batch_size for r in result.rows}):
            pts = [(r.context, getattr(r, field)) for r in result.rows
                   if r.batch_size == b and getattr(r, field) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"batch {b}")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("tokens / s")
    fig.suptitle(f"{result.spec}: {result.device_name}, {result.dtype}, backend {result.backend}", fontsize=10)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def write(result: BenchResult, out: Path) -> tuple[Path, Path]:
    """``out/bench.json`` and ``out/bench.png``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench.json"
    write_text(json_path, result.model_dump_json(indent=2))
    return json_path, plot(result, out / "bench.png")


__all__ = ["limits_table", "memory_table", "plot", "table", "write"]
