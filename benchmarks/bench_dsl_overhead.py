"""Does the DSL cost anything? Train-step time of a DSL-built NoLoop GDN model as a ratio
to a hand-written module with the same ops (same layers, same parameters, same math).

Steps of the two models are interleaved and the median of per-step ratios is reported,
so machine noise hits both alike. Target: ratio ≤ 1.05.

    python benchmarks/bench_dsl_overhead.py [--steps 30] [--threads 2]

2026-11-30, 2-core shared CPU VM (other jobs running), torch 2.13.0+cpu, --steps 15:

    DSL-built step     median   2577.7 ms
    hand-written step  median   2630.0 ms
    ratio DSL / hand   median 1.022  (target <= 1.05)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from builders.layers.ffn import SwiGLU
from builders.layers.linear_mixers import GatedDeltaNetTorch
from builders.model import build_model
from nas.load import loads_arch

SPEC = """
name: bench_noloop_gdn
model:
  vocab_size: 512
  width: 128
  defaults:
    gdn: {num_heads: 2, head_dim: 64, expand_v: 1}
    swiglu: {hidden_size: 352}
num_layers: 4
layer: {mixer: {kind: gdn}, ffn: {kind: swiglu}}
"""


class HandWritten(nn.Module):
    """The NoLoop GDN LM written directly: embed → [norm, GDN, norm, SwiGLU] × L → norm → tied head."""

    def __init__(self, vocab: int, width: int, layers: int, ffn: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "n1": nn.RMSNorm(width, eps=1e-6),
                "mixer": GatedDeltaNetTorch(hidden_size=width, num_heads=2, head_dim=64, expand_v=1),
                "n2": nn.RMSNorm(width, eps=1e-6),
                "ffn": SwiGLU(width, intermediate_size=ffn),
            }))
        self.norm = nn.RMSNorm(width, eps=1e-6)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for b in self.blocks:
            h = h + b["mixer"](b["n1"](h))
            h = h + b["ffn"](b["n2"](h))
        logits = F.linear(self.norm(h), self.embed.weight)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _step(loss_fn, opt) -> float:
    t0 = time.perf_counter()
    loss = loss_fn()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dsl = build_model(loads_arch(SPEC), backend="torch")
    hand = HandWritten(512, 128, 4, 352)
    # identical weights, so both do exactly the same arithmetic
    hand_state = dict(zip(hand.state_dict(), dsl.state_dict().values()))
    hand.load_state_dict(hand_state)
    assert sum(p.numel() for p in dsl.parameters()) == sum(p.numel() for p in hand.parameters())
    ids = torch.randint(0, 512, (args.batch, args.seq_len))
    labels = torch.roll(ids, -1, 1)
    opt_d = torch.optim.AdamW(dsl.parameters(), lr=1e-4)
    opt_h = torch.optim.AdamW(hand.parameters(), lr=1e-4)
    run_d = lambda: dsl(ids, labels=labels).loss
    run_h = lambda: hand(ids, labels)
    for _ in range(3):
        _step(run_d, opt_d), _step(run_h, opt_h)
    ratios, td, th = [], [], []
    for _ in range(args.steps):
        a, b = _step(run_d, opt_d), _step(run_h, opt_h)
        td.append(a), th.append(b), ratios.append(a / b)
    print(f"B={args.batch} T={args.seq_len} width 128, 4 NoLoop GDN layers, {args.steps} interleaved steps")
    print(f"DSL-built step     median {statistics.median(td) * 1e3:8.1f} ms")
    print(f"hand-written step  median {statistics.median(th) * 1e3:8.1f} ms")
    print(f"ratio DSL / hand   median {statistics.median(ratios):.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
