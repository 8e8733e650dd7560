"""Proxy training-step time on CPU: ``tiny_noloop`` (GDN), its attention twin, ``tiny_mixerloop``.

One thread; a step is forward + backward + clip + AdamW with the trainer's parameter groups
(:func:`runners.bench.measure.train_step`), batch 32, at T = 8, 64, 256 tokens. Per T the
models are timed round-robin (the median of ``--repeats`` rounds after one warm-up round), so
load drift on a shared CPU hits all alike, by this process's CPU time (``time.process_time``:
other jobs on the machine do not inflate it; one thread does all the work). Printed per model:

- ``÷ attn``: step time over the attention twin's in the same rounds (``tiny_noloop`` with
  ``layer.mixer: {kind: attn, num_heads: 2}``, the quickstart's attention);
- ``GFLOP/s``: the cost model's training FLOPs per token (:func:`nas.cost.train_flops_at`:
  forward + twice the forward for the backward, a truncated backward priced as such) × the
  step's tokens / step time (:func:`runners.bench.mfu.model_flops`);
- ``matmul``: FLOP/s of the model's own training matmuls (every Linear and the head, forward,
  input- and weight-gradient products at B·T rows) timed in this process
  (:func:`runners.bench.mfu.matmul_rate`, as ``loopnas bench`` does on CPU); ``MFU`` =
  GFLOP/s ÷ matmul.

``python benchmarks/bench_proxy.py [--repeats 7] [--seq-lens 8,64,256] [--out FILE.md]``
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from builders.model import build_model
from nas import load_arch, loads_arch
from runners.bench.compare import provenance
from runners.bench.measure import train_step
from runners.bench.mfu import matmul_rate, model_flops

BATCH = 32
BASELINE = "attention twin"
ARCHS = Path(__file__).resolve().parents[1] / "spaces" / "archs"  # benchmarks/spaces shadows the package


def arch_path(name: str) -> Path:
    return ARCHS / f"{name}.yaml"


def attention_twin():
    """``tiny_noloop`` with softmax attention (2 heads of 32) in place of GDN."""
    data = yaml.safe_load(arch_path("tiny_noloop").read_text())
    data["name"] = "tiny_noloop_attn"
    data["layer"]["mixer"] = {"kind": "attn", "num_heads": 2}
    return loads_arch(yaml.safe_dump(data))


def models() -> dict[str, object]:
    return {"tiny_noloop (GDN)": load_arch(arch_path("tiny_noloop")), BASELINE: attention_twin(),
            "tiny_mixerloop (GDN, T=4)": load_arch(arch_path("tiny_mixerloop"))}


def _prepared(arch, seq_len: int):
    torch.manual_seed(0)
    model = build_model(arch, backend="torch", device="cpu").train()
    step, _, _ = train_step(model, BATCH, seq_len)
    return model, step


def _seconds(step) -> float:
    start = time.process_time()
    step()
    return time.process_time() - start


def measure(seq_len: int, repeats: int) -> list[dict]:
    """One row per model at ``seq_len``: median step seconds, its ratio to the baseline, MFU."""
    archs = models()
    prepared = {name: _prepared(arch, seq_len) for name, arch in archs.items()}
    times: dict[str, list[float]] = {name: [] for name in archs}
    for _ in range(repeats + 1):  # the first round warms up (AdamW allocates its state)
        for name, (_, step) in prepared.items():
            times[name].append(_seconds(step))
    rows = []
    for name, arch in archs.items():
        seconds = statistics.median(times[name][1:])
        achieved = model_flops(arch, seq_len, BATCH * seq_len / seconds)
        matmul = matmul_rate(prepared[name][0], BATCH * seq_len, clock=time.process_time)
        rows.append({"model": name, "T": seq_len, "ms": 1e3 * seconds, "flops": achieved, "matmul": matmul})
    base = next(r["ms"] for r in rows if r["model"] == BASELINE)
    for r in rows:
        r["ratio"] = r["ms"] / base
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | T | ms / step | ÷ attn | GFLOP/s | matmul GFLOP/s | MFU |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['T']} | {r['ms']:.1f} | {r['ratio']:.2f} | {r['flops'] / 1e9:.1f} "
                     f"| {r['matmul'] / 1e9:.0f} | {100 * r['flops'] / r['matmul']:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seq-lens", default="8,64,256")
    parser.add_argument("--out", help="also write the table, with its command and machine, to this .md file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [r for t in (int(x) for x in args.seq_lens.split(",")) for r in measure(t, args.repeats)]
    text = table(rows)
    print(text)
    if args.out:
        header = provenance(f"1 thread, batch {BATCH}, median of {args.repeats}")
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(header + text + "\n\n")


if __name__ == "__main__":
    main()
