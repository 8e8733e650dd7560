"""Is hop_induction a proxy on which loops matter (issue 19)? Train the quickstart's one-layer,
width-64, parameter-matched candidates (GDN and softmax attention; no loop, FullLoop T=2/4,
MixerLoop T=4, residual gate shared) on ``hop_induction`` at several seeds, and print final
accuracy per seed, mean ± standard error, seconds per run, and whether each looped GDN
separates from unlooped GDN beyond seed noise (every looped seed above every unlooped one,
and the difference above 3 standard errors).

    python experiments/hop_pilot.py --steps 800 --n 32 --k 3 --eval-batches 32
    python experiments/hop_pilot.py --steps 300 --n 16 --mixers gdn --json-out out.jsonl

Candidates are built exactly as a sweep trial of ``experiments/spaces/hop_pilot.yaml`` (the
quickstart's layout when the pilot ran: same lowering and parameter matching); only the proxy (task, steps, lr, eval batches) is replaced. Every
run evaluates on the same fixed eval batches (``eval_seed``), as a sweep's replicates do.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import optuna
import torch

from nas.noise import mean_se
from nas.space import _label, load_space
from runners.train import TrainConfig, train

GATE = {"kind": "residual_gate", "shared": True}
LOOPS = {
    "none": {"boundary": "none"},
    "block T=2": {"boundary": "block", "T": 2, "update": GATE},
    "block T=4": {"boundary": "block", "T": 4, "update": GATE},
    "mixer T=4": {"boundary": "mixer", "T": 4, "update": GATE},
}


def run(space, params: dict, args, seed: int) -> tuple[float, float, float]:
    """(final eval accuracy, wall seconds, CPU seconds) of one candidate at one seed."""
    fixed = optuna.trial.FixedTrial({k: _label(v) for k, v in params.items()})
    arch, _, _ = space.candidate(fixed)
    config = TrainConfig(
        task="hop_induction", task_params={"n": args.n, "k": args.k, "alphabet_size": args.alphabet},
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, eval_every=args.steps,
        eval_batches=args.eval_batches, seed=seed, eval_seed=args.eval_seed, progress=False)
    start, cpu = time.perf_counter(), time.process_time()
    result = train(arch, config)
    return result.final["acc"], time.perf_counter() - start, time.process_time() - cpu


def separation(looped: list[float], base: list[float]) -> tuple[float, float, bool]:
    """(difference of means, its standard error, separated: min(looped) > max(base) and
    difference > 3 s.e.)."""
    (m1, s1), (m0, s0) = mean_se(looped), mean_se(base)
    diff, se = m1 - m0, (s1**2 + s0**2) ** 0.5
    return diff, se, min(looped) > max(base) and diff > 3 * se


def parse_k(text: str):
    if text == "mixed":
        return text
    ks = [int(v) for v in text.split(",")]
    return ks[0] if len(ks) == 1 else ks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="experiments/spaces/hop_pilot.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--mixers", nargs="+", default=["gdn", "attn"], choices=["gdn", "attn"])
    ap.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--k", type=parse_k, default=3, help="an int, a comma list, or 'mixed'")
    ap.add_argument("--alphabet", type=int, default=4)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-batches", type=int, default=32)
    ap.add_argument("--eval-seed", type=int, default=0)
    ap.add_argument("--json-out", help="append one JSON line per candidate to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    space = load_space(args.space)
    setting = {k: getattr(args, k) for k in ("n", "k", "alphabet", "steps", "batch_size", "lr",
                                               "eval_batches")}
    print(json.dumps(setting), flush=True)
    rows = {}
    for mixer in args.mixers:
        for loop in args.loops:
            runs = [run(space, {"mixer": mixer, **LOOPS[loop]}, args, s) for s in args.seeds]
            accs, secs, cpus = ([r[i] for r in runs] for i in range(3))
            mean, se = mean_se(accs)
            rows[(mixer, loop)] = accs
            print(f"{mixer:4s} {loop:9s} " + " ".join(f"{a:.3f}" for a in accs)
                  + f"   {mean:.3f} ± {se:.3f}   {statistics.fmean(secs):.1f} s/run "
                  f"({statistics.fmean(cpus):.1f} CPU s)", flush=True)
            if args.json_out:
                with open(args.json_out, "a") as f:
                    f.write(json.dumps({**setting, "mixer": mixer, "loop": loop, "seeds": args.seeds,
                                        "acc": accs, "seconds": secs, "cpu_seconds": cpus}) + "\n")
    for mixer in args.mixers:
        base = rows.get((mixer, "none"))
        for loop in args.loops:
            if base is None or loop == "none":
                continue
            diff, se, ok = separation(rows[(mixer, loop)], base)
            print(f"{mixer} {loop} - none: {diff:+.3f} ± {se:.3f}  "
                  f"{'SEPARATED' if ok else 'within noise'}")


if __name__ == "__main__":
    main()
