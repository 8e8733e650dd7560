"""Peak CPU memory of the blockwise DSA / NSA layers against their dense (T, T) twins, by context.

    python benchmarks/bench_sparse_memory.py [--lengths 1024 2048 4096 8192 16384] [--dense-max 8192]

Each (case, implementation, T) runs in a fresh subprocess: it builds the layer and its input,
warms up at T = 256, restarts the peak resident set (``VmHWM`` in /proc, Linux; not
``ru_maxrss``, which a child inherits from the process that forked it), runs one forward (and for
``dsa-train`` the backward of output + indexer loss), and reports the rise of the peak: the
memory the call itself needed, in MiB. glibc's mmap threshold is pinned at 64 KiB (``ENV``)
so that a freed tensor leaves the resident set at once and the peak counts live tensors.
Tiny heads, batch 1, float32, one thread; the dense twin runs only up to ``--dense-max``.
``--out`` writes the table as markdown.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# glibc's dynamic mmap threshold would keep freed tensors in the heap, so the peak RSS would
# count allocator slack; a fixed 64 KiB threshold maps and unmaps every tensor above it
ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
CASES = {  # the layer and its kwargs; heads are tiny so the (T, T) terms dominate the dense twin
    "dsa": ("dsa", dict(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=8, index_heads=2, index_head_dim=8,
                        topk=64)),
    "dsa-train": ("dsa", dict(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=8, index_heads=2,
                              index_head_dim=8, topk=64)),
    "nsa": ("nsa", dict(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=8, block_size=64, block_counts=4,
                        window_size=128)),
}


def dense_dsa(layer, x):
    """The layer's former forward: (T, T) index scores, keep mask, masked attention and loss."""
    from builders.ops.attention import dsa_index_scores, dsa_select, masked_attention

    q, k, v = layer.project(x)
    q_i, k_i, w_i = layer.indexer(x.detach(), layer.rope_theta)
    scores = dsa_index_scores(q_i, k_i, w_i)  # (B, T, T)
    keep = dsa_select(scores.detach(), layer.topk)
    o = layer.output(x, masked_attention(q, k, v, keep[:, None]))
    if not layer.training:
        return o, None
    with torch.no_grad():
        kr = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        p = (torch.einsum("bthd,bshd->bhts", q, kr) * q.shape[-1] ** -0.5)
        p = p.masked_fill(~keep[:, None], float("-inf")).softmax(-1).mean(1)
    log_q = scores.masked_fill(~keep, float("-inf")).log_softmax(-1).masked_fill(~keep, 0.0)
    return o, (p * (p.clamp_min(1e-30).log() - log_q)).sum(-1).mean()


def dense_nsa(layer, x):
    from builders.layers.attention import _heads
    from builders.ops.attention import apply_rotary, nsa_attention_reference

    q, k, v = (_heads(p(x), layer.head_dim) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    q, k = apply_rotary(q, k, layer.rope_theta)
    gates = _heads(layer.g_proj(x), 3).sigmoid().unbind(-1)
    o = nsa_attention_reference(q, k, v, *gates, block_counts=layer.block_counts, block_size=layer.block_size,
                                window=layer.window_size)
    return layer.o_proj(o.flatten(2)), None


def _call(case: str, impl: str, layer, x):
    if impl == "dense":
        return (dense_dsa if CASES[case][0] == "dsa" else dense_nsa)(layer, x)
    return layer(x), getattr(layer, "aux_loss", None)


def _status_bytes(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process from /proc (Linux), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Restart VmHWM at the current RSS (Linux >= 4.0); else it holds the peak since exec."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def measure(case: str, impl: str, t: int) -> dict:
    """Rise of the peak RSS over one call at context t (this process should be fresh)."""
    from builders.layers.attention import DeepSeekSparseAttention, NativeSparseAttention

    torch.set_num_threads(1)
    torch.manual_seed(0)
    kind, kw = CASES[case]
    layer = (DeepSeekSparseAttention if kind == "dsa" else NativeSparseAttention)(**kw)
    train = case.endswith("train")
    layer.train(train)
    for length in (256, t):
        x = torch.randn(1, length, kw["hidden_size"], requires_grad=train)
        gc.collect()
        _reset_peak()
        before = _status_bytes("VmHWM")
        start = time.perf_counter()
        with torch.set_grad_enabled(train):
            o, aux = _call(case, impl, layer, x)
            if train:
                (o.square().mean() + aux).backward()
        seconds = time.perf_counter() - start
        peak = _status_bytes("VmHWM")
        del o, aux
    return {"case": case, "impl": impl, "T": t, "peak_bytes": peak - before, "seconds": seconds}


def run_one(case: str, impl: str, t: int) -> dict:
    """``measure`` in a fresh interpreter, so each peak starts from the same baseline."""
    code = ("import json; from benchmarks.bench_sparse_memory import measure; "
            f"print(json.dumps(measure({case!r}, {impl!r}, {t})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)})
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    mib = 2 ** 20
    lines = ["| case | T | blockwise MiB | dense MiB | dense / blockwise | blockwise MiB per 1k tokens "
             "| blockwise s | dense s |", "|---|---|---|---|---|---|---|---|"]
    by = {(r["case"], r["impl"], r["T"]): r for r in rows}
    for case, _, t in sorted({(r["case"], "", r["T"]) for r in rows}):
        b, d = by[(case, "blockwise", t)], by.get((case, "dense", t))
        dense = f"{d['peak_bytes'] / mib:.1f}" if d else "skipped"
        ratio = f"{d['peak_bytes'] / max(b['peak_bytes'], 1):.1f}x" if d else "-"
        dense_s = f"{d['seconds']:.2f}" if d else "-"
        lines.append(f"| {case} | {t} | {b['peak_bytes'] / mib:.1f} | {dense} | {ratio} | "
                     f"{b['peak_bytes'] / mib / (t / 1024):.2f} | {b['seconds']:.2f} | {dense_s} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--dense-max", type=int, default=8192, help="longest context the dense twin runs at")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, help="write the table (markdown) here")
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        for t in args.lengths:
            for impl in ("blockwise", "dense"):
                if impl == "dense" and t > args.dense_max:
                    continue
                rows.append(run_one(case, impl, t))
                r = rows[-1]
                print(f"{case:10s} {impl:9s} T={t:6d} peak +{r['peak_bytes'] / 2 ** 20:8.1f} MiB "
                      f"{r['seconds']:6.2f} s", flush=True)
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")

if __name__ == "__main__":
    main()
