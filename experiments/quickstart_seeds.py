"""Does the quickstart's proxy separate its candidates? Train chosen candidates of
``spaces/quickstart.yaml`` at several seeds, exactly as a sweep trial would (same canonical
spec, same proxy settings), and print final accuracy per seed with mean ± standard error.

    python experiments/quickstart_seeds.py --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import optuna
import torch

from nas.space import _label, load_space
from runners.sweep.driver import _merge
from runners.train import TrainConfig, train

GATE = {"kind": "residual_gate", "shared": True}
CANDIDATES = {
    "gdn, no loop": {"mixer": "gdn", "boundary": "none"},
    "gdn, FullLoop T=4": {"mixer": "gdn", "boundary": "block", "T": 4, "update": GATE},
    "attn, no loop": {"mixer": "attn", "boundary": "none"},
    "attn, FullLoop T=4": {"mixer": "attn", "boundary": "block", "T": 4, "update": GATE},
}


def run(space, params: dict, seed: int) -> float:
    fixed = optuna.trial.FixedTrial({k: _label(v) for k, v in params.items()})
    arch, proxy, _ = space.candidate(fixed)
    config = _merge(space.spec.proxy.model_dump(mode="json", exclude_none=True), proxy)
    config.update(seed=seed, progress=False)
    return train(arch, TrainConfig.model_validate(config)).final["acc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="spaces/quickstart.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    torch.set_num_threads(1)
    space = load_space(args.space)
    rows = {}
    for name, params in CANDIDATES.items():
        start = time.perf_counter()
        accs = [run(space, params, s) for s in args.seeds]
        mean = statistics.fmean(accs)
        se = statistics.stdev(accs) / len(accs) ** 0.5 if len(accs) > 1 else float("nan")
        rows[name] = {"acc": accs, "mean": mean, "se": se}
        print(f"{name:22s} " + " ".join(f"{a:.3f}" for a in accs)
              + f"   mean {mean:.3f} ± {se:.3f}   ({time.perf_counter() - start:.0f} s)", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
