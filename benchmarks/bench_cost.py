"""Pricing throughput of ``nas.cost``: specs per second on one core.

Generates a population of random valid specs (width, depth, hybrid mixers, loop
boundary and T, elastic depth, schedules), lowers them once, then times
``cost(arch)`` (the full sheet: every per-op row, per-k figures, memory) and
``projection_flops(arch)`` (what a sweep's constraint check needs). Lowering is
excluded: a sweep prices canonical specs.

    python benchmarks/bench_cost.py [--n 2000] [--seed 0]

Measured on this project's dev box (2 shared cores at load ~6, one core used; 2,000 specs,
a quarter elastic, 14 layers on average; seeds 0 and 1): cost() 7,100-9,000 specs/s of CPU
time (2,000-4,100 specs/s wall, the other core's jobs competing); projection_flops()
25,000-28,000 specs/s of CPU time.
"""
from __future__ import annotations

import argparse
import random
import time

from nas.cost import cost, projection_flops
from nas.load import resolve, spec_from_dict
from nas.errors import SpecError

MIXERS = {
    "gdn": {"kind": "gdn", "num_heads": 4, "head_dim": 64, "expand_v": 1},
    "kda": {"kind": "kda", "num_heads": 4, "head_dim": 64},
    "mamba2": {"kind": "mamba2", "head_dim": 64, "state_size": 64},
    "attn": {"kind": "attn", "num_heads": 8, "num_kv_heads": 2, "output_gate": True},
    "swa": {"kind": "attn", "num_heads": 8, "window": 512},
    "dsa": {"kind": "dsa", "num_heads": 8, "index_heads": 4, "index_head_dim": 32, "topk": 256},
    "nsa": {"kind": "nsa", "num_heads": 16, "num_kv_heads": 4, "head_dim": 64},
}


def random_source(rng: random.Random, i: int) -> dict:
    """One source spec; mixers, loop sugar and sizes drawn at random."""
    width = rng.choice([256, 384, 512, 768, 1024])
    L = rng.randint(4, 24)
    linear = rng.choice(["gdn", "kda", "mamba2"])
    full = rng.choice(["attn", "swa", "dsa", "nsa", linear])
    spec = {"name": f"bench_{i}", "model": {"vocab_size": 32000, "width": width}, "num_layers": L,
            "hybrid": {"ratio": {"full": 1, "lin": rng.choice([1, 3, 4])},
                       "placement": rng.choice(["interleave", "bookend", "front"]),
                       "mixers": {"full": MIXERS[full], "lin": MIXERS[linear]}},
            "layer": {"mixer": {"kind": "gdn"},
                      "ffn": rng.choice([{"kind": "swiglu"},
                                         {"kind": "moe", "num_experts": 8, "top_k": 2}])}}
    boundary = rng.choice(["none", "mixer", "block", "elr"])
    T = rng.randint(2, 6)
    if boundary == "elr":
        rec = rng.randint(1, L - 2)
        spec["loop"] = {"boundary": "elr", "prelude": 1, "recurrent": rec, "coda": L - 1 - rec, "T": T,
                        "update": {"kind": "gated_step"}, "conditioning": "index_budget"}
        spec["elastic"] = {"eval": list(range(1, T + 1))}
        spec["kv_policy"] = rng.choice(["per_loop", "last_loop"])
    elif boundary != "none":
        spec["loop"] = {"boundary": boundary, "T": T,
                        "update": rng.choice([{"kind": "residual_gate"}, {"kind": "reinject", "mode": "concat"}])}
        if boundary == "block" and full in ("attn", "swa") and rng.random() < 0.3:
            spec["loop"]["windows"] = ["full"] + [rng.choice([128, 256, 512]) for _ in range(T - 1)]
    return spec


def population(n: int, seed: int) -> list:
    rng, out, i = random.Random(seed), [], 0
    while len(out) < n:
        try:
            out.append(resolve(spec_from_dict(random_source(rng, i))))
        except SpecError:
            pass
        i += 1
    return out


def rate(fn, archs) -> tuple[float, float]:
    """Specs per second of CPU time (one core, robust to a busy machine) and of wall time."""
    cpu, wall = time.process_time(), time.perf_counter()
    for a in archs:
        fn(a)
    return len(archs) / (time.process_time() - cpu), len(archs) / (time.perf_counter() - wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    archs = population(args.n, args.seed)
    elastic = sum(a.elastic is not None for a in archs)
    print(f"{len(archs)} specs ({elastic} elastic), "
          f"{sum(a.L for a in archs) / len(archs):.1f} layers on average")
    for label, fn in (("cost(), first pass", cost), ("cost(), second pass", cost),
                      ("projection_flops()", projection_flops)):
        cpu, wall = rate(fn, archs)
        print(f"{label:<24}{cpu:>9,.0f} specs/s CPU  {wall:>9,.0f} specs/s wall")

if __name__ == "__main__":
    main()
