"""Cached against uncached ``generate()`` of an exported model, through transformers.

Exports a spec (no weights: loopnas's init), loads it with ``AutoModelForCausalLM`` and
times greedy ``generate(use_cache=True)`` (one prefill, then one decode step per token)
against ``generate(use_cache=False)`` (the whole sequence rerun every step), checking
that both give the same tokens (guaranteed at KV policy ``per_loop``; a ``last_loop`` spec
such as tiny_elr may differ). Prints both times and their ratio.

    python benchmarks/bench_export_generate.py [--spec tiny_lt2_interleave] [--prompt 128] [--new 64]

Measured on this project's dev box (2 shared cores at load ~4-5, one thread; loopnas's init):
tiny_lt2_interleave (4 layers, T = 4) prompt 128 + 64 new: 2.2 s cached, 4.0 s uncached
(1.8x); prompt 512 + 32 new: 1.5 s against 6.4 s (4.4x); tiny_elr at prompt 512 + 32
new: 1.4 s against 4.3 s (3.0x). A model this small decodes at Python overhead (a step
runs every loop iteration of every layer); the gap grows with the prompt.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from runners.export import export_spec

ROOT = Path(__file__).resolve().parents[1]


def timed(model, ids: torch.Tensor, new: int, use_cache: bool) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, do_sample=False, use_cache=use_cache)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny_lt2_interleave")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        out = export_spec(ROOT / "spaces" / "archs" / f"{args.spec}.yaml", Path(tmp) / "x").out
        config = AutoConfig.from_pretrained(str(out), trust_remote_code=True)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=True).eval()
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    timed(model, ids[:, :8], 2, True)  # warm-up
    cached_s, cached = timed(model, ids, args.new, True)
    full_s, full = timed(model, ids, args.new, False)
    same = torch.equal(cached, full)
    print(f"{args.spec}: prompt {args.prompt}, {args.new} new tokens, {args.threads} thread(s)")
    print(f"cached {cached_s:.2f} s, uncached {full_s:.2f} s, speed-up {full_s / cached_s:.1f}x, "
          f"same tokens: {same}")


if __name__ == "__main__":
    main()
