"""torch.compile on CPU for the proxy trainer: compile time against the steady-state gain.

One thread, batch 32; a step is the trainer's (forward + backward + clip + AdamW,
:func:`runners.bench.measure.train_step`) with the model's forward compiled as the trainer
compiles it (``torch.compile(model)``, default mode) or eager. Per model and T, two models
built from the same seed:

- ``compile s``: wall time of the compiled model's first step (Dynamo tracing, Inductor's
  C++ code generation and build, forward and backward graphs) less one steady compiled step;
  ``again s``: the same for a second model of the same spec compiled in the same process
  afterwards (Inductor's caches warm: a seed replicate in the same worker);
- ``eager ms`` / ``compiled ms``: the median step of ``--repeats`` rounds, eager and compiled
  timed in turn (this process's CPU time, ``time.process_time``), and their ratio;
- ``break-even``: steps after which the compiled run has caught up (compile s ÷ the saving
  per step; ``never`` when compiled is not faster); ``400-step trial``: the compiled trial's
  time over the eager one's for a trial of ``--trial-steps`` steps (compile included; below 1
  pays).

Each trial of a sweep builds a new model, so it pays the compile again (Inductor's cache on
disk helps only identical graphs). ``--fresh-cache`` points Inductor at an empty cache
directory first, so the compile time is a cold one.

``python benchmarks/bench_compile.py [--repeats 7] [--seq-lens 8,64] [--out FILE.md]``
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from builders.model import build_model
from nas import load_arch
from runners.bench.compare import markdown, provenance
from runners.bench.measure import train_step

BATCH = 32
MODELS = ("tiny_noloop", "tiny_mixerloop")
ARCHS = Path(__file__).resolve().parents[1] / "spaces" / "archs"  # benchmarks/spaces shadows the package


def _steps(name: str, seq_len: int):
    """(eager step, compiled step) on two models with the same initial weights."""
    arch = load_arch(ARCHS / f"{name}.yaml")
    out = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = build_model(arch, backend="torch", device="cpu").train()
        step, _, _ = train_step(torch.compile(model) if compiled else model, BATCH, seq_len)
        out.append(step)
    return out


def _wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(name: str, seq_len: int, repeats: int, trial_steps: int) -> dict:
    eager, compiled = _steps(name, seq_len)
    first = _wall(compiled)  # compiles the forward and, at its backward, the backward graph
    again = _wall(_steps(name, seq_len)[1])
    eager()
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(repeats):
        times["eager"].append(_cpu(eager))
        times["compiled"].append(_cpu(compiled))
    e, c = (statistics.median(times[k]) for k in ("eager", "compiled"))
    compile_s = max(0.0, first - c)
    saving = e - c
    return {"model": name, "T": seq_len, "compile_s": compile_s, "again_s": max(0.0, again - c), "eager_ms": 1e3 * e, "compiled_ms": 1e3 * c,
            "ratio": c / e, "break_even": compile_s / saving if saving > 0 else None,
            "trial": (compile_s + trial_steps * c) / (trial_steps * e)}


def table(rows: list[dict], trial_steps: int) -> str:
    return markdown(
        ["model", "T", "compile s", "again s", "eager ms", "compiled ms", "compiled ÷ eager", "break-even steps",
         f"{trial_steps}-step trial ÷ eager"],
        [[r["model"], r["T"], f"{r['compile_s']:.1f}", f"{r['again_s']:.1f}", f"{r['eager_ms']:.1f}", f"{r['compiled_ms']:.1f}",
          f"{r['ratio']:.2f}", "never" if r["break_even"] is None else f"{r['break_even']:.0f}",
          f"{r['trial']:.2f}"] for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seq-lens", default="8,64")
    parser.add_argument("--trial-steps", type=int, default=400)
    parser.add_argument("--fresh-cache", action="store_true", help="an empty Inductor cache: cold compiles")
    parser.add_argument("--out", help="also append the table, with its command and machine, to this .md file")
    args = parser.parse_args()
    if args.fresh_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_")
    torch.set_num_threads(1)
    rows = [measure(name, int(t), args.repeats, args.trial_steps)
            for t in args.seq_lens.split(",") for name in MODELS]
    text = table(rows, args.trial_steps)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(provenance(f"1 thread, batch {BATCH}, median of {args.repeats}") + text + "\n\n")


if __name__ == "__main__":
    main()
