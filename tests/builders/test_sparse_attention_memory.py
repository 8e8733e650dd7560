"""DSA and NSA need memory linear in the context: 16k tokens on a CPU within a stated bound.

Each measurement runs in a fresh interpreter (``benchmarks/bench_sparse_memory.py``): the rise
of the peak resident set (``VmHWM``, restarted just before the call) over one no-grad forward
of the layer, with glibc's mmap threshold pinned so that freed tensors leave the resident set
(the peak then counts live tensors).
Batch 1, tiny heads, float32. The bound is ``BYTES_PER_TOKEN × T``; the dense twin already
breaks it at 4k, and at 16k its (B, T, HI, T) index scores alone would be 2 GiB.
"""

import pytest

from benchmarks.bench_sparse_memory import CASES, run_one

# DSA keeps, per block of 128 queries, scores and top-k scratch over the visible keys
# (~20 B per key and query row: ~2.5 KiB per token) and (T, topk) indices: ~3 KiB per token
# measured. NSA's blocks are small (compressed keys, 4 x 64 selected, window 128); what grows
# is the activations, ~0.45 KiB per token measured.
BOUND = {"dsa": 8 * 1024, "nsa": 2 * 1024}  # bytes per token of context


@pytest.mark.parametrize("case", ["dsa", "nsa"])
def test_16k_context_forward_stays_within_a_linear_bound(case):
    t = 16384
    blockwise = run_one(case, "blockwise", t)
    assert 0 < blockwise["peak_bytes"] <= BOUND[case] * t, blockwise
    short = 4096
    dense = run_one(case, "dense", short)
    assert dense["peak_bytes"] > BOUND[case] * short, dense  # quadratic: over the line already at 4k
    if case == "dsa":
        index_heads = CASES[case][1]["index_heads"]
        assert index_heads * t * t * 4 > 10 * BOUND[case] * t  # the dense (B, T, HI, T) float32 scores at 16k
