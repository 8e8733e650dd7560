"""CPU fwd+bwd time of each chunked linear-recurrent op over chunk sizes × sequence lengths.

The tiny specs' shapes, float32, one thread: GDN, DeltaNet and KDA at B=32, H=2, K=V=32
(q/k l2-normalised in the op, as the layers call it), Mamba2's SSD at B=32, H=4, P=32, N=32.
Per T every chunk size C in 4..256 up to T's next power of two, one chunk of exactly T
(``one``, where T is none of those), the token recurrence (``rec``, T <= 64) and the rule
:func:`builders.ops.linear.chunk_size_for` picks are timed round-robin, in a shuffled order
each round (in a fixed order the entry after the slow recurrence read up to 1.3x slow): the
least of ``--repeats`` rounds after one warm-up, by this process's CPU time (other jobs on a
shared CPU still inflate it through the caches and memory, and only ever upwards, so the
least is the closest to the op's own cost; a median moved by up to 1.5x between identical
configurations here). Printed per op: ms per (T, C), the fastest, and the rule's choice with
its time over the fastest. The rule is timed as its own entry, so where it picks a timed C
its ratio shows the noise left.

``python benchmarks/bench_chunk_size.py [--repeats 5] [--ops gdn,deltanet,kda,ssd] [--seq-lens 1,2,...] [--out FILE.md]``
"""
from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F

from builders.ops.linear import (
    chunk_delta_rule,
    chunk_gated_delta_rule,
    chunk_kda,
    chunk_size_for,
    chunk_ssd,
    recurrent_delta_rule_ref,
    recurrent_gated_delta_rule_ref,
    recurrent_kda_ref,
    recurrent_ssd_ref,
)
from runners.bench.compare import provenance

SEQ_LENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)
CHUNKS = (4, 8, 16, 32, 64, 128, 256)
REC_MAX_T = 64
B = 32


def _delta_inputs(T: int, per_channel: bool, gen: torch.Generator, gated: bool = True) -> dict:
    H, D = 2, 32
    xs = dict(q=torch.randn(B, T, H, D, generator=gen), k=torch.randn(B, T, H, D, generator=gen),
              v=torch.randn(B, T, H, D, generator=gen), beta=torch.rand(B, T, H, generator=gen))
    if gated:
        xs["g"] = F.logsigmoid(torch.randn(*((B, T, H, D) if per_channel else (B, T, H)), generator=gen) + 2)
    return xs


def _ssd_inputs(T: int, gen: torch.Generator) -> dict:
    H, P, N = 4, 32, 32
    return dict(x=torch.randn(B, T, H, P, generator=gen), dt=F.softplus(torch.randn(B, T, H, generator=gen)),
                A=-torch.rand(H, generator=gen) - 0.5, B=torch.randn(B, T, H, N, generator=gen),
                C=torch.randn(B, T, H, N, generator=gen), D=torch.ones(H))


# op name -> (chunked fn, recurrent fn, inputs(T, gen), extra kwargs)
OPS = {
    "gdn": (chunk_gated_delta_rule, recurrent_gated_delta_rule_ref, lambda T, g: _delta_inputs(T, False, g),
            {"use_qk_l2norm_in_kernel": True}),
    "deltanet": (chunk_delta_rule, recurrent_delta_rule_ref, lambda T, g: _delta_inputs(T, False, g, gated=False),
                 {"use_qk_l2norm_in_kernel": True}),
    "kda": (chunk_kda, recurrent_kda_ref, lambda T, g: _delta_inputs(T, True, g), {"use_qk_l2norm_in_kernel": True}),
    "ssd": (chunk_ssd, recurrent_ssd_ref, _ssd_inputs, {}),
}


RULE_KIND = {"gdn": "delta", "deltanet": "delta", "kda": "kda", "ssd": "ssd"}  # chunk_size_for's kind


def _fwd_bwd_seconds(fn, inputs: dict, grad: torch.Tensor, **kwargs) -> float:
    start = time.process_time()
    o, _ = fn(**inputs, **kwargs)
    o.backward(grad)  # a dense output gradient, as a layer's is (o.sum()'s is a stride-0 broadcast)
    return time.process_time() - start


def candidates(op: str, T: int) -> dict[str, tuple]:
    """label -> (fn, kwargs): every chunk size up to T's next power of two, the recurrence, the rule."""
    chunk_fn, rec_fn, _, kw = OPS[op]
    top = 1 << (T - 1).bit_length()
    out = {str(c): (chunk_fn, {**kw, "chunk_size": c}) for c in CHUNKS if c <= max(top, CHUNKS[0])}
    if T not in CHUNKS and T > 2:
        out["one"] = (chunk_fn, {**kw, "chunk_size": T})  # one chunk of exactly T, no padding
    if T <= REC_MAX_T:
        out["rec"] = (rec_fn, kw)
    out["rule"] = (chunk_fn, kw)  # chunk_size=None: chunk_size_for(T), or the recurrence where it picks 0
    return out


def sweep(op: str, T: int, repeats: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    inputs = {n: x.requires_grad_(n not in ("A", "D")) for n, x in OPS[op][2](T, gen).items()}
    cands = candidates(op, T)
    out_like = inputs["v"] if "v" in inputs else inputs["x"]
    grad = torch.randn(out_like.shape, generator=gen)
    times = {label: [] for label in cands}
    order = list(cands)
    for _ in range(repeats + 1):
        random.Random(len(times[order[0]])).shuffle(order)  # no candidate always follows the slow recurrence
        for label in order:
            fn, kw = cands[label]
            times[label].append(_fwd_bwd_seconds(fn, inputs, grad, **kw))
    return {label: min(ts[1:]) for label, ts in times.items()}


def table(op: str, results: dict[int, dict[str, float]]) -> str:
    cols = [str(c) for c in CHUNKS] + ["one", "rec"]
    lines = [f"### {op}: fwd+bwd ms by chunk size C (one: one chunk of T tokens; rec: token recurrence)", "",
             "| T | " + " | ".join(cols) + " | fastest | rule | rule ÷ fastest |",
             "|---:|" + "---:|" * (len(cols) + 3)]
    for T, ms in results.items():
        timed = {k: v for k, v in ms.items() if k != "rule"}
        best = min(timed, key=timed.get)
        cells = [f"{1e3 * ms[c]:.2f}" if c in ms else "" for c in cols]
        rule = chunk_size_for(T, "cpu", RULE_KIND[op])
        lines.append(f"| {T} | " + " | ".join(cells) + f" | {best} | {rule or 'rec'} | {ms['rule'] / timed[best]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    parser.add_argument("--out", help="also append the tables, with the command and machine, to this .md file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seq_lens = [int(t) for t in args.seq_lens.split(",")]
    tables = []
    for op in args.ops.split(","):
        tables.append(table(op, {T: sweep(op, T, args.repeats) for T in seq_lens}))
        print(tables[-1] + "\n", flush=True)
    if args.out:
        header = provenance(f"1 thread, least of {args.repeats}")
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(header + "\n\n".join(tables) + "\n\n")


if __name__ == "__main__":
    main()
