"""Does looping help a sub-quadratic mixer more than full attention? (LT2 §3.6, proxy scale)

Five models, width 64, 2 layers, T = 4, every one at the same number of unique parameters
(``nas.budget`` solves each FFN hidden size against the GDN NoLoop reference):

    gdn  NoLoop | gdn MixerLoop | gdn FullLoop | attn NoLoop | attn FullLoop

Loops use the MixerLoop/LT2 residual gate (one zero-initialised ρ[T, d] shared by all
regions). Each model trains on the state-tracking + recall curriculum (n = m, promote at
0.90 eval accuracy, a fixed step budget per stage); the headline is ``n_max``, the largest
n solved, with the best eval accuracy reached at every stage. One seed, CPU, one thread.

    python experiments/loop_vs_mixer.py                    # writes experiments/results/
    python experiments/loop_vs_mixer.py --stage-steps 50   # a quick smoke run
    python experiments/loop_vs_mixer.py --stage-steps 1500 --models gdn_noloop,gdn_fullloop --tag long
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

from nas.cost import projection_flops, unique_params
from nas.load import resolve, spec_from_dict
from runners.tasks import Curriculum
from runners.train import CurriculumConfig, TrainConfig, train

WIDTH, LAYERS, T, REF_FFN = 64, 2, 4, 128
MIXERS = {
    "gdn": {"kind": "gdn", "num_heads": 2, "head_dim": 32, "expand_v": 1},
    "attn": {"kind": "attn", "num_heads": 4, "output_gate": True},
}
LOOPS = {
    "noloop": None,
    "mixerloop": {"boundary": "mixer", "T": T, "update": {"kind": "residual_gate", "shared": True}},
    "fullloop": {"boundary": "block", "T": T, "update": {"kind": "residual_gate", "shared": True}},
}
MODELS = [("gdn", "noloop"), ("gdn", "mixerloop"), ("gdn", "fullloop"), ("attn", "noloop"), ("attn", "fullloop")]


def source(mixer: str, loop: str, vocab: int, ffn: int = REF_FFN, target: float | None = None,
           loops: int = T) -> dict:
    spec = {"name": f"{mixer}_{loop}", "model": {"vocab_size": vocab, "width": WIDTH},
            "num_layers": LAYERS, "layer": {"mixer": MIXERS[mixer], "ffn": {"kind": "swiglu", "hidden_size": ffn}}}
    if LOOPS[loop] is not None:
        spec["loop"] = {**LOOPS[loop], "T": loops}
    if target is not None:
        spec["match"] = {"unique_params": target, "vary": "ffn_hidden", "tolerance": 0.01}
    return spec


def matched_archs(vocab: int, loops: int = T, names: set[str] | None = None) -> dict[str, object]:
    """Every model at the unique-parameter count of GDN NoLoop with FFN hidden 128."""
    target = unique_params(resolve(spec_from_dict(source("gdn", "noloop", vocab))))
    return {f"{m}_{l}": resolve(spec_from_dict(source(m, l, vocab, target=target, loops=loops)))
            for m, l in MODELS if names is None or f"{m}_{l}" in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="2,4,8,16", help="curriculum stages n = m")
    parser.add_argument("--stage-steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loops", type=int, default=T, help="T of the looped models")
    parser.add_argument("--models", default=None, help="comma-separated subset, e.g. gdn_noloop,attn_fullloop")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stages = tuple(int(s) for s in args.stages.split(","))
    vocab = Curriculum(stages).task().vocab_size
    config = TrainConfig(task="state_tracking", curriculum=CurriculumConfig(stages=stages, stage_steps=args.stage_steps),
                         batch_size=args.batch_size, lr=args.lr, min_lr=args.lr / 10, warmup_steps=10,
                         eval_every=25, eval_batches=4, seed=args.seed, progress=False)
    rows = []
    names = set(args.models.split(",")) if args.models else None
    for name, arch in matched_archs(vocab, args.loops, names).items():
        start = time.perf_counter()
        result = train(arch, config)
        row = {"model": name, "unique_params": unique_params(arch),
               "ffn_hidden": arch.layers[0].ffn.hidden_size,
               "proj_flops_per_token": int(projection_flops(arch).total),
               "n_max": result.curriculum["n_max"], "steps": result.steps,
               **{f"acc@{n}": (f"{result.curriculum['stage_acc'][n]:.3f}"
                              if n in result.curriculum["stage_acc"] else "-") for n in stages},
               "wall_s": round(time.perf_counter() - start, 1)}
        rows.append(row)
        print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    write(rows, args, stages)


def write(rows: list[dict], args, stages: tuple[int, ...]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "loop_vs_mixer" + (f"_{args.tag}" if args.tag else "")
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    head = list(rows[0])
    lines = [f"# {stem}: state tracking + recall curriculum (stages {list(stages)}, "
             f"{args.stage_steps} steps per stage, T={args.loops}, batch {args.batch_size}, lr {args.lr}, "
             f"seed {args.seed})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
