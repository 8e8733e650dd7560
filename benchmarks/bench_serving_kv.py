"""KV cache memory across loops: ELR's last-loop policy vs per-loop caches, measured.

One elastic ELR hybrid (attention + GDN, prelude 1, recurrent 2, coda 1; tiny_elr with its
attention layer moved into the recurrent block, ``--placement``, so that it loops) is
prefilled at ``k = 1..4`` loops under each KV policy; the bytes its cache holds are read from the cache
(``cache.nbytes()``) and set beside the cost model's ``kv_cache_bytes`` / ``state_bytes``
for the same spec with that policy. ELR: under ``last_loop`` the KV cache stays at the
one-loop size at any loop count; ``per_loop`` grows with ``k`` (recurrent state grows with
``k`` under both: one state per application, but it does not grow with the context).

    python benchmarks/bench_serving_kv.py [--spec tiny_elr] [--placement gdn,attn,gdn,gdn]
        [--context 256] [--batch-size 2] [--out benchmarks/results/bench_serving_kv.md]
    python benchmarks/bench_serving_kv.py --smoke
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
from runners.bench.compare import markdown, variant, write_markdown
from runners.bench.measure import random_ids

HEADERS = ["policy", "k", "KV bytes", "KV ÷ KV at k=1", "cost-model KV", "state bytes",
           "cost-model state", "measured = cost model"]
POLICIES = ("per_loop", "last_loop")


@torch.inference_mode()
def run(spec: str, context: int, batch_size: int, ks: list[int], placement: list[str] | None = None,
        device: str = "cpu", backend: str = "torch") -> list[list]:
    """``placement``: the hybrid's per-layer mixer names (None: the spec's own)."""
    from nas.load import parse_yaml
    from spaces import arch_path

    edits = {}
    if placement is not None:
        edits["hybrid"] = {**parse_yaml(arch_path(spec).read_text())["hybrid"], "placement": placement}
    rows = []
    for policy in POLICIES:
        arch = variant(spec, f"{spec}_{policy}", kv_policy=policy, **edits)
        model = build_model(arch, backend=backend, device=device).eval()
        ids = random_ids(model, batch_size, context)
        dtype = "fp32" if model.embed.weight.dtype == torch.float32 else "bf16"
        sheet = cost(arch, seq_len=context, dtype=dtype)
        first = None
        for k in ks:
            held = model.prefill(ids, loops=k)[1].nbytes()
            first = first or held["kv"]
            priced = sheet.at(k) if arch.elastic is not None else sheet.figures
            kv, state = priced.kv_cache_bytes * batch_size, priced.state_bytes * batch_size
            rows.append([policy, k, held["kv"], held["kv"] / first, kv, held["state"], state,
                         "yes" if (held["kv"], held["state"]) == (kv, state) else "NO"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny_elr")
    parser.add_argument("--placement", type=lambda s: None if s == "shipped" else s.split(","),
                        default=["gdn", "attn", "gdn", "gdn"], help="per-layer mixers, or 'shipped'")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--loops", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a short context, seconds")
    parser.add_argument("--out", help="also write the table, with this command, to a markdown file")
    args = parser.parse_args()
    if args.smoke:
        args.context, args.batch_size = 16, 1
    torch.set_num_threads(args.threads)
    rows = run(args.spec, args.context, args.batch_size, args.loops, args.placement)
    table = markdown(HEADERS, rows)
    last = [r for r in rows if r[0] == "last_loop"]
    per = [r for r in rows if r[0] == "per_loop"]
    summary = (f"\nAt k={args.loops[-1]}: per-loop KV is {per[-1][3]:.3g}× its k=1 size, last-loop KV "
               f"{last[-1][3]:.3g}×; last-loop holds {last[-1][2] / per[-1][2]:.3g}× the per-loop bytes.\n")
    print(table + summary)
    if args.out:
        write_markdown(args.out, __doc__.splitlines()[0], table, summary, timed=False)


if __name__ == "__main__":
    main()
