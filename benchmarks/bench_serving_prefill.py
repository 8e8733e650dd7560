"""Prefill throughput of MixerLoop vs FullLoop at equal T (MixerLoop reports up to 1.52×).

MixerLoop repeats only each layer's mixer T times and runs its FFN once; FullLoop repeats
whole layers. Both (and the NoLoop model they share weights' shapes with) prefill the same
random context, in turn, median of ``--repeats``; the measured MixerLoop ÷ FullLoop
throughput sits beside the cost model's forward-FLOPs ratio FullLoop ÷ MixerLoop, the speed-up
a purely compute-bound device would show.

    python benchmarks/bench_serving_prefill.py [--contexts 256,1024,4096] [--batch-size 1]
        [--repeats 5] [--specs tiny_noloop,tiny_mixerloop,tiny_fullloop]
        [--out benchmarks/results/bench_serving_prefill.md]
    python benchmarks/bench_serving_prefill.py --smoke
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run as a script, sys.path starts at this folder, whose spaces/ would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from builders.model import build_model
from nas.cost import cost
from runners.bench.compare import markdown, round_robin, variant, write_markdown
from runners.bench.measure import random_ids

HEADERS = ["batch", "context", "NoLoop tok/s", "MixerLoop tok/s", "FullLoop tok/s",
           "MixerLoop ÷ FullLoop", "FLOPs ratio FullLoop ÷ MixerLoop"]
TINY = ("tiny_noloop", "tiny_mixerloop", "tiny_fullloop")


def run(contexts: list[int], batch_size: int, repeats: int, specs=TINY, device: str = "cpu",
        backend: str = "torch") -> list[list]:
    archs = [variant(name) for name in specs]
    torch.manual_seed(0)
    models = [build_model(a, backend=backend, device=device).eval() for a in archs]
    dev = models[0].embed.weight.device
    rows = []
    for c in contexts:
        ids = random_ids(models[0], batch_size, c)
        with torch.inference_mode():
            fns = {a.name: (lambda m=m: m.prefill(ids)) for a, m in zip(archs, models)}
            seconds = round_robin(fns, dev, repeats)
        tps = [batch_size * c / seconds[a.name] for a in archs]
        flops = [cost(a, seq_len=c).figures.forward_flops for a in archs]
        rows.append([batch_size, c, *tps, tps[1] / tps[2], flops[2] / flops[1]])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024, 4096])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--specs", type=lambda s: tuple(s.split(",")), default=TINY,
                        help="NoLoop, MixerLoop, FullLoop specs, in this order")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny contexts, seconds")
    parser.add_argument("--out", help="also write the table, with this command, to a markdown file")
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.repeats = [32, 64], 1
    torch.set_num_threads(args.threads)
    rows = run(args.contexts, args.batch_size, args.repeats, args.specs)
    table = markdown(HEADERS, rows)
    ratios = [r[5] for r in rows]
    summary = (f"\n{args.specs[1]} ÷ {args.specs[2]} prefill throughput: {min(ratios):.3g}–{max(ratios):.3g}× "
               f"over these contexts; the cost model's forward-FLOPs ratio is {rows[-1][6]:.3g}×.\n")
    print(table + summary)
    if args.out:
        write_markdown(args.out, __doc__.splitlines()[0], table, summary)


if __name__ == "__main__":
    main()
