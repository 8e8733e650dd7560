"""CPU fwd+bwd time of loopnas's chunked gated delta rule vs fla's naive chunk form and a token loop.

float32, B=8, T=256, H=4, K=V=32, chunk 64; median of ``--repeats`` after one warm-up, all in one
process, implementations interleaved. ``python benchmarks/bench_gdn.py [--repeats 7] [--threads 1]``

2026-11-30, 2-core CPU VM shared with other jobs (load average ~4), torch 2.13.0+cpu, fla 0.6.0:

    --threads 1 (default), median of 7
    impl                                    median ms   vs loopnas
    loopnas chunk_gated_delta_rule               65.9        1.00x
    fla naive_chunk_gated_delta_rule            307.8        4.67x
    token recurrence (loopnas ref)              540.0        8.20x

    --threads 2, median of 7 (OpenMP threads contend with the other jobs: everything slower)
    loopnas chunk_gated_delta_rule              439.6        1.00x
    fla naive_chunk_gated_delta_rule           1967.0        4.47x
    token recurrence (loopnas ref)             8182.0       18.61x
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from builders.ops.linear import chunk_gated_delta_rule, recurrent_gated_delta_rule_ref

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule

B, T, H, D = 8, 256, 4, 32


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    xs = dict(
        q=torch.randn(B, T, H, D, generator=gen),
        k=F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1),
        v=torch.randn(B, T, H, D, generator=gen),
        g=F.logsigmoid(torch.randn(B, T, H, generator=gen)),
        beta=torch.rand(B, T, H, generator=gen),
    )
    return {n: x.requires_grad_() for n, x in xs.items()}


def _fwd_bwd_seconds(fn, inputs: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    o, _ = fn(**inputs)
    o.sum().backward()
    return time.perf_counter() - start


def _median_seconds(impls: dict, inputs: dict[str, torch.Tensor], repeats: int) -> dict[str, float]:
    """Round-robin over implementations, so load drift on a shared CPU hits all alike; first round is warm-up."""
    times = {name: [] for name in impls}
    for _ in range(repeats + 1):
        for name, fn in impls.items():
            times[name].append(_fwd_bwd_seconds(fn, inputs))
    return {name: statistics.median(ts[1:]) for name, ts in times.items()}


IMPLS = {
    "loopnas chunk_gated_delta_rule": chunk_gated_delta_rule,
    "fla naive_chunk_gated_delta_rule": naive_chunk_gated_delta_rule,
    "token recurrence (loopnas ref)": recurrent_gated_delta_rule_ref,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the CPU is shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    inputs = _inputs()
    times = _median_seconds(IMPLS, inputs, args.repeats)
    base = times["loopnas chunk_gated_delta_rule"]
    print(f"B={B} T={T} H={H} D={D} float32, threads={torch.get_num_threads()}, median of {args.repeats}")
    print(f"{'impl':38s} {'median ms':>10s} {'vs loopnas':>12s}")
    for name, t in times.items():
        print(f"{name:38s} {t * 1e3:10.1f} {t / base:11.2f}x")


if __name__ == "__main__":
    main()
