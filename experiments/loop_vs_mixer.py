"""Does looping help a sub-quadratic mixer more than full attention? (LT2 §3.6, proxy scale)

Five models, width 64, 2 layers, T = 4, every one at the same number of unique parameters
(``nas.budget`` solves each FFN hidden size against the GDN NoLoop reference):

    gdn  NoLoop | gdn MixerLoop | gdn FullLoop | attn NoLoop | attn FullLoop

Loops use the MixerLoop/LT2 residual gate (one zero-initialised ρ[T, d] shared by all
regions). Each model trains on the state-tracking + recall curriculum (n = m, promote at
0.90 eval accuracy on the *last* answer, a fixed step budget per stage); the headline is
``n_max``, the largest n solved, with the eval accuracies at the stage the run ended on
and at longer sequences (more steps n at the same m: length extrapolation). CPU, one
thread per process; one JSON line per (model, seed) run, then ``--aggregate`` writes the
mean ± standard error over seeds and the looped-vs-unlooped comparisons (issue #29): each
looped model against its mixer's NoLoop on every metric, ``nas.noise.compare`` (a paired
t-test over the seeds both hold, Welch's when a metric leaves some runs out), Holm-adjusted
over the comparisons table (``nas.noise.holm``). ``--aggregate`` reads only the committed
runs file, so ``results/loop_vs_mixer.{md,csv}`` regenerate from it
(``tests/project/test_experiment_reanalysis.py`` checks that they do).

    python experiments/loop_vs_mixer.py --seeds 0,1,2 --models gdn_noloop,gdn_fullloop
    python experiments/loop_vs_mixer.py --seeds 0,1,2 --models gdn_mixerloop,attn_noloop,attn_fullloop
    python experiments/loop_vs_mixer.py --aggregate          # results/loop_vs_mixer.{md,csv}
    python experiments/loop_vs_mixer.py --stage-steps 20 --seeds 0 --tag smoke
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import time
from pathlib import Path

import torch

from nas.cost import projection_flops, unique_params
from nas.noise import TIE_ALPHA, compare, holm
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
METRICS = ("last_acc", "acc", "ptr_acc")


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


def run(args) -> None:
    torch.set_num_threads(1)
    stages = tuple(int(s) for s in args.stages.split(","))
    vocab = Curriculum(stages).task().vocab_size
    longer = tuple({"n": int(n)} for n in args.extrapolate.split(",")) if args.extrapolate else ()
    names = set(args.models.split(",")) if args.models else None
    runs = args.out / f"{stem(args)}_runs.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        config = TrainConfig(task="state_tracking",
                             curriculum=CurriculumConfig(stages=stages, stage_steps=args.stage_steps),
                             batch_size=args.batch_size, lr=args.lr, min_lr=args.lr / 10, warmup_steps=10,
                             eval_every=args.eval_every, eval_batches=args.eval_batches, seed=seed,
                             extrapolate=longer, progress=False)
        for name, arch in matched_archs(vocab, args.loops, names).items():
            start = time.perf_counter()
            result = train(arch, config)
            row = {"model": name, "seed": seed, "T": args.loops, "stages": list(stages),
                   "stage_steps": args.stage_steps, "unique_params": unique_params(arch),
                   "ffn_hidden": arch.layers[0].ffn.hidden_size,
                   "proj_flops_per_token": int(projection_flops(arch).total),
                   "n_max": result.curriculum["n_max"], "steps": result.steps,
                   "stage_last_acc": result.curriculum["stage_acc"],
                   "solved_at": {int(e.metrics["n"]): e.step for e in result.evals
                                 if e.metrics["last_acc"] >= config.curriculum.threshold},
                   "end_m": int(result.final.get("n", 0)), "final": result.final,
                   "extrapolation": [{"n": p.params["n"], **p.metrics} for p in result.extrapolation],
                   "wall_s": round(time.perf_counter() - start, 1)}
            with open(runs, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def mean_se(values: list[float]) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.3f} ± {sd / math.sqrt(len(values)):.3f}"


def summary(rows: list[dict]) -> list[dict]:
    """One line per model: mean ± s.e. over its runs of every metric."""
    order = [f"{m}_{l}" for m, l in MODELS]
    table = []
    for name in sorted({r["model"] for r in rows}, key=order.index):
        runs = [r for r in rows if r["model"] == name]
        hardest = max(int(m) for r in runs for m in r["stage_last_acc"])
        line = {"model": name, "seeds": ",".join(str(r["seed"]) for r in runs),
                "unique_params": runs[0]["unique_params"], "proj_flops_per_token": runs[0]["proj_flops_per_token"],
                "n_max": mean_se([r["n_max"] for r in runs])}
        for m in sorted({int(m) for r in runs for m in r["stage_last_acc"]}):
            line[f"best last_acc@{m}"] = mean_se([r["stage_last_acc"][str(m)] for r in runs
                                             if str(m) in r["stage_last_acc"]])
        for m in sorted({int(m) for r in runs for m in r["solved_at"]}):
            steps = [r["solved_at"][str(m)] for r in runs if str(m) in r["solved_at"]]
            line[f"solved {m}: runs, step"] = f"{len(steps)}/{len(runs)}, {mean_se(steps)}"
        at_end = [r for r in runs if r["end_m"] == hardest]
        line["hardest m (runs ending there)"] = f"{hardest} ({len(at_end)}/{len(runs)})"
        for key in METRICS:  # the final evaluation of the runs that ended on the hardest stage
            line[f"end {key}"] = mean_se([r["final"][key] for r in at_end if key in r["final"]])
        for n in sorted({p["n"] for r in at_end for p in r["extrapolation"]}):
            line[f"end last_acc, n={n}"] = mean_se([p["last_acc"] for r in at_end
                                                    for p in r["extrapolation"] if p["n"] == n])
        line["wall_s"] = round(sum(r["wall_s"] for r in runs), 1)
        table.append(line)
    return table


def per_seed(runs: list[dict], metric: str) -> dict[int, float]:
    """A metric's value per seed, for the runs that have it: ``n_max``, ``best last_acc@m`` (the
    stage's best evaluation), ``solved m at step`` (runs that solved it), ``end <key> at m=M``
    (the final evaluation of the runs that ended on stage M)."""
    out = {}
    for r in runs:
        if metric == "n_max":
            out[r["seed"]] = float(r["n_max"])
        elif metric.startswith("best last_acc@"):
            m = metric.split("@")[1]
            if m in r["stage_last_acc"]:
                out[r["seed"]] = float(r["stage_last_acc"][m])
        elif metric.startswith("solved "):
            m = metric.split()[1]
            if m in r["solved_at"]:
                out[r["seed"]] = float(r["solved_at"][m])
        elif metric.startswith("end "):
            key, m = metric.split()[1], int(metric.rsplit("=", 1)[1])
            if r["end_m"] == m and key in r["final"]:
                out[r["seed"]] = float(r["final"][key])
    return out


def comparisons(rows: list[dict]) -> list[dict]:
    """Each looped model against its mixer's NoLoop, on every metric both have at two or more
    runs: ``nas.noise.compare`` by seed, Holm-adjusted over all of them."""
    stages = sorted({int(m) for r in rows for m in r["stage_last_acc"]})
    metrics = ["n_max", *[f"best last_acc@{m}" for m in stages], *[f"solved {m} at step" for m in stages],
               *[f"end {key} at m={m}" for m in stages for key in ("last_acc", "ptr_acc")]]
    models = {r["model"] for r in rows}
    out = []
    for looped in [f"{m}_{l}" for m, l in MODELS if l != "noloop"]:
        base = looped.split("_")[0] + "_noloop"
        if looped not in models or base not in models:
            continue
        for metric in metrics:
            a = per_seed([r for r in rows if r["model"] == looped], metric)
            b = per_seed([r for r in rows if r["model"] == base], metric)
            if len(a) < 2 or len(b) < 2:
                continue
            t = compare(list(a.values()), list(b.values()), list(a), list(b))
            out.append({"looped": looped, "noloop": base, "metric": metric, "n": f"{len(a)} / {len(b)}",
                        "test": t})
    for c, adjusted in zip(out, holm([c["test"].p for c in out])):
        c["holm"] = adjusted
    return out


def comparisons_markdown(comps: list[dict]) -> list[str]:
    lines = ["## Looped against unlooped (issue #29)", "",
             f"`nas.noise.compare` of each looped model with its mixer's NoLoop: a paired t-test over the "
             f"seeds both runs hold, Welch's t-test when a metric leaves a run out (a stage not solved or "
             f"not reached); Holm over the table's {sum(math.isfinite(c['holm']) for c in comps)} tests. "
             f"Separated: Holm p < {TIE_ALPHA:g}. Δ = looped − NoLoop; runs = looped / NoLoop runs that have "
             "the metric.", "",
             "| looped | vs | metric | runs | Δ ± s.e. | test | p | Holm p | separated |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in comps:
        t = c["test"]
        sep = "–" if not math.isfinite(c["holm"]) else ("yes" if c["holm"] < TIE_ALPHA else "no")
        p = f"{t.p:.3g}" if math.isfinite(t.p) else "–"
        adjusted = f"{c['holm']:.3g}" if math.isfinite(c["holm"]) else "–"
        lines.append(f"| {c['looped']} | {c['noloop']} | {c['metric']} | {c['n']} | {t.diff:+.3f} ± {t.se:.3f} | "
                     f"{'paired t' if t.paired else 'Welch t'} | {p} | {adjusted} | {sep} |")
    finite = [c for c in comps if math.isfinite(c["holm"])]
    lowest = min(finite, key=lambda c: c["test"].p) if finite else None
    lines += ["", f"{sum(c['holm'] < TIE_ALPHA for c in finite)} of {len(finite)} comparisons separate"
              + (f" (the smallest p: {lowest['looped']} on {lowest['metric']}, p = {lowest['test'].p:.3g}, "
                 f"Holm {lowest['holm']:.3g})." if lowest else ".")]
    return lines


def render(rows: list[dict], name: str = "loop_vs_mixer") -> tuple[str, str]:
    """(the markdown, the csv) of a runs file's rows."""
    table = summary(rows)
    head = list(dict.fromkeys(k for line in table for k in line))
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=head, restval="-")
    writer.writeheader()
    writer.writerows(table)
    r0 = rows[0]
    lines = [f"# {name}: state tracking + recall curriculum (stages {r0['stages']}, "
             f"{r0['stage_steps']} steps per stage, T={r0['T']}), mean ± s.e. over seeds", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(line.get(k, "-")) for k in head) + " |" for line in table]
    comps = comparisons(rows)
    if comps:
        lines += ["", *comparisons_markdown(comps)]
    return "\n".join(lines) + "\n", buf.getvalue()


def aggregate(args) -> None:
    rows = [json.loads(line) for line in (args.out / f"{stem(args)}_runs.jsonl").read_text().splitlines()]
    md, table = render(rows, stem(args))
    with open(args.out / f"{stem(args)}.csv", "w", newline="") as f:
        f.write(table)
    (args.out / f"{stem(args)}.md").write_text(md)
    print(md, end="")


def stem(args) -> str:
    return "loop_vs_mixer" + (f"_{args.tag}" if args.tag else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="2,4", help="curriculum stages n = m")
    parser.add_argument("--stage-steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seeds", default="0", help="comma-separated, e.g. 0,1,2")
    parser.add_argument("--loops", type=int, default=T, help="T of the looped models")
    parser.add_argument("--models", default=None, help="comma-separated subset, e.g. gdn_noloop,attn_fullloop")
    parser.add_argument("--extrapolate", default="8,16", help="longer n evaluated at the end ('' for none)")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--aggregate", action="store_true", help="summarise the runs file; no training")
    args = parser.parse_args()
    aggregate(args) if args.aggregate else run(args)


if __name__ == "__main__":
    main()
