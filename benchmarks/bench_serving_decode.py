"""Decode throughput of looped GDN vs looped full attention as the context grows (LT2).

A FullLoop model (T=4) with GDN mixers and its twin with full softmax attention (same
width, heads and FFN): both are prefilled with the same context, then decode one token at
a time, one step of each model in turn, median over ``--steps`` steps. GDN's per-token work
and cache are constant in the context; attention reads a KV cache that grows with it, so
its decode throughput should fall and the GDN/attention ratio rise (LT2: about 3× at batch
1 and 32k on a GPU). On a CPU at tiny width, per-step Python overhead is a large constant
share of both models' time, so the ratio rises more slowly than on a GPU.

    python benchmarks/bench_serving_decode.py [--contexts 256,1024,4096,8192] [--batch-sizes 1,4]
        [--steps 16] [--max-tokens 16384] [--out benchmarks/results/bench_serving_decode.md]
    python benchmarks/bench_serving_decode.py --smoke
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run as a script, sys.path starts at this folder, whose spaces/ would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from builders.model import build_model
from runners.bench.compare import interleaved_decode, markdown, variant, with_mixer, write_markdown

HEADERS = ["batch", "context", "GDN ms/token", "attn ms/token", "GDN ÷ attn throughput",
           "GDN vs first context", "attn vs first context", "attn KV bytes", "GDN state bytes"]


def models(base: str, heads: int, device: str, backend: str = "torch") -> dict:
    gdn = variant(base, f"{base}_gdn")
    attn = with_mixer(base, {"kind": "attn", "num_heads": heads}, f"{base}_attn")
    torch.manual_seed(0)
    return {"gdn": build_model(gdn, backend=backend, device=device),
            "attn": build_model(attn, backend=backend, device=device)}


def run(contexts: list[int], batch_sizes: list[int], steps: int, max_tokens: int, base: str = "tiny_fullloop",
        heads: int = 2, device: str = "cpu", backend: str = "torch") -> list[list]:
    pair = models(base, heads, device, backend)
    rows = []
    for b in batch_sizes:
        first = None
        for c in (c for c in contexts if b * c <= max_tokens):
            r = interleaved_decode(pair, b, c, steps)
            first = first or r
            rows.append([b, c, r["gdn"]["ms_per_token"], r["attn"]["ms_per_token"],
                         r["gdn"]["tokens_per_s"] / r["attn"]["tokens_per_s"],
                         r["gdn"]["tokens_per_s"] / first["gdn"]["tokens_per_s"],
                         r["attn"]["tokens_per_s"] / first["attn"]["tokens_per_s"],
                         r["attn"]["kv_bytes"], r["gdn"]["state_bytes"]])
    return rows


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=ints, default=[256, 1024, 4096, 8192])
    parser.add_argument("--batch-sizes", type=ints, default=[1, 4])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16384, help="skip batch × context above this")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny contexts, seconds")
    parser.add_argument("--out", help="also write the table, with this command, to a markdown file")
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.batch_sizes, args.steps = [32, 64], [1], 3
    torch.set_num_threads(args.threads)
    rows = run(args.contexts, args.batch_sizes, args.steps, args.max_tokens)
    table = markdown(HEADERS, rows)
    last = {r[0]: r for r in rows}  # each batch size's longest context
    summary = "\n" + "; ".join(
        f"batch {b}, context {r[1]}: GDN ÷ attention {r[4]:.3g}× (first context: "
        f"{next(x for x in rows if x[0] == b)[4]:.3g}×); GDN keeps {r[5]:.2g} of its first-context "
        f"throughput, attention {r[6]:.2g}" for b, r in last.items()) + ".\n"
    print(table + summary)
    if args.out:
        write_markdown(args.out, __doc__.splitlines()[0], table, summary)


if __name__ == "__main__":
    main()
