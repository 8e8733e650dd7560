"""Does the one-shot ranking agree with stand-alone training?

A 6-layer GDN/attention hybrid with 2 attention layers has 15 placements. One supernet is
trained once (every layer a switch, each step a random placement with exactly 2 attention
layers: PostNAS's ratio-constrained sampling) and all 15 placements are scored with its
weights (``loopnas sweep`` on a one-shot space, exhaustive search). Then the top, middle
and bottom placements of that ranking are trained stand-alone with the same proxy
settings, and the two scores are compared: Kendall τ over the placements trained both
ways (with its exact permutation p-value), and the wall-clock of the one-shot search
against training all 15 stand-alone (each placement's time: the mean stand-alone time).

    python experiments/oneshot_vs_standalone.py            # ≈ 10 min on a 2-core CPU
    python experiments/oneshot_vs_standalone.py --steps 60 --pick 1   # a smoke run

With ``--seeds N`` every chosen sub-network is trained stand-alone at seeds 0..N-1 and
ranked by its mean eval loss (standard error over the seeds); τ is taken against the
mean, and a permutation one-way ANOVA says whether the stand-alone differences between
the chosen sub-networks exceed seed noise at all (and the mean τ between single seeds'
rankings, the agreement that stand-alone training has with itself). ``--axis loops``
searches loop counts instead: a 2-layer GDN + attention hybrid looped as a block, one
supernet over both placements with elastic loop counts 1-4, every (placement, k) scored
one-shot and trained stand-alone, on the S3 word problem.

    R=experiments/results/oneshot_vs_standalone.md C=runs/oneshot_vs_standalone_cache.jsonl
    python experiments/oneshot_vs_standalone.py --seeds 5 --kv-pairs 2 --write $R   # ≈ 20 min
    python experiments/oneshot_vs_standalone.py --axis loops --seeds 3 --write $R   # ≈ 20 min
    P5=runs/oneshot_vs_standalone_placements-kv2-steps300-seeds5/results.json
    python experiments/oneshot_vs_standalone.py --seeds 3 --kv-pairs 2 --all --cache $C --reuse $P5 --write $R
    python experiments/oneshot_vs_standalone.py --seeds 3 --kv-pairs 2 --all --cache $C --reuse $P5 \
        --reverse --out runs/oneshot_vs_standalone_all_reverse   # beside it: the other end of the list
    python experiments/oneshot_vs_standalone.py --seeds 3 --kv-pairs 2 --all --supernet-steps 1500 \
        --cache $C --reuse $P5 --write $R   # the same stand-alone runs, a 5x longer supernet

``--remedy`` runs the one-shot side once per remedy of ``oneshot.remedy`` (``none`` for
none; the presets of :data:`REMEDIES`) against one stand-alone side: read from a committed
section's per-seed values (``--standalone-from``; ``--verify N`` retrains its first N
candidates at seed 0 to show the values still reproduce and to time a stand-alone run now),
and writes one table: τ with its interval over seeds and exact p (``nas.oneshot.agreement``,
the self-check's statistics), and each search's wall time against training every candidate.

    python experiments/oneshot_vs_standalone.py --axis loops --task hop \
        --remedy none finetune sandwich few_shot per_loop_gates \
        --standalone-from loops-hop-steps400-seeds3 --verify 2 --write $R

``--reanalyse`` (issue #29) rewrites, in every committed section, the lines that redo its
statistics with the library's from the per-seed values the section prints: the candidates'
differences by ``nas.noise.permutation_test`` paired by seed, τ by ``nas.oneshot.agreement``,
Holm over the two; on the loops axis each loop count against k = 1 within an order
(``nas.noise.compare``) and the order with k as context. A seeded section writes the same
lines when it is run; ``tests/project/test_experiment_reanalysis.py`` checks the committed file.

    python experiments/oneshot_vs_standalone.py --reanalyse

Writes ``experiments/results/oneshot_vs_standalone.md`` (``--write``: the whole file in the
original mode; a section of its own, replaced on a rerun, with ``--seeds`` or ``--axis
loops``) and the one-shot experiment directory under ``--out``; ``--render`` rewrites a
section from a finished (or partial) ``results.json``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nas.noise import kendall_tau  # noqa: E402
from nas.spec import stored_spec  # noqa: E402
from runners.results.records import read_trials  # noqa: E402
from runners.sweep.run import run_sweep  # noqa: E402
from runners.train import TrainConfig, train  # noqa: E402

SPACE = {
    "name": "oneshot_vs_standalone",
    "description": "2 of 6 layers attention, the rest GDN: which placement?",
    "base": {
        "name": "hybrid_2of6",
        "model": {"vocab_size": 64, "width": 32, "defaults": {
            "attn": {"num_heads": 2}, "gdn": {"num_heads": 2, "head_dim": 16, "expand_v": 1},
            "swiglu": {"hidden_size": 64}}},
        "num_layers": 6,
        "hybrid": {"ratio": {"attn": 1, "gdn": 2}, "placement": "interleave"},
    },
    # check: false: this script trains its own stand-alone comparison, and times the search alone
    "oneshot": {"sampling": "ratio", "search": {"strategy": "exhaustive"}, "check": False},
    "objectives": [{"metric": "eval_loss", "direction": "minimize"},
                   {"metric": "kv_bytes", "direction": "minimize"}],
    "proxy": {"task": "mqar", "task_params": {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4},
              "steps": 300, "batch_size": 16, "lr": 0.01, "eval_every": 1000, "eval_batches": 8},
}


LOOP_SPACE = {
    "name": "oneshot_vs_standalone_loops",
    "description": "a GDN + attention pair looped as a block: which order, how many loops?",
    "base": {
        "name": "hybrid_1of2_looped",
        "model": {"vocab_size": 64, "width": 32, "defaults": {
            "attn": {"num_heads": 2}, "gdn": {"num_heads": 2, "head_dim": 16, "expand_v": 1},
            "swiglu": {"hidden_size": 64}}},
        "num_layers": 2,
        "hybrid": {"ratio": {"gdn": 1, "attn": 1}, "placement": "interleave"},
        "loop": {"boundary": "block", "T": 2, "update": {"kind": "residual_gate", "shared": True}},
    },
    "oneshot": {"loops": [1, 2, 3, 4], "sampling": "ratio", "search": {"strategy": "exhaustive"}, "check": False},
    "objectives": [{"metric": "eval_loss", "direction": "minimize"},
                   {"metric": "projection_flops", "direction": "minimize"}],
    "proxy": {"task": "s5", "task_params": {"seq_len": 8, "degree": 3},
              "steps": 400, "batch_size": 32, "lr": 0.01, "eval_every": 1000, "eval_batches": 8},
}

# The loop axis on 3-hop induction heads (``--task hop``): the quickstart's proxy, on which a
# loop lifts one GDN layer beyond seed noise (experiments/results/calibration_quickstart.md); the
# pair at the quickstart's width and lr.
HOP_LOOP_SPACE = {
    **LOOP_SPACE,
    "name": "oneshot_vs_standalone_loops_hop",
    "base": {**LOOP_SPACE["base"], "model": {"vocab_size": 256, "width": 64, "tie_embeddings": True, "defaults": {
        "attn": {"num_heads": 2}, "gdn": {"num_heads": 2, "head_dim": 32, "expand_v": 1},
        "swiglu": {"hidden_size": 128}}}},
    "proxy": {"task": "hop_induction", "task_params": {"n": 32, "k": 3, "alphabet_size": 4},
              "steps": 400, "batch_size": 32, "lr": 0.003, "eval_every": 1000, "eval_batches": 16},
}


REMEDIES = {  # oneshot.remedy of each --remedy name
    "none": {},
    "finetune": {"finetune": {"fraction": 0.1}},
    "sandwich": {"sandwich": {"distill": True, "random": 1}},
    "few_shot": {"few_shot": {"split": "layer0", "warm": 0.5}},
    "per_loop_gates": {"per_loop_gates": True},
    "per_loop_gates+finetune": {"per_loop_gates": True, "finetune": {"fraction": 0.1}},
    "few_shot+finetune": {"few_shot": {"split": "layer0", "warm": 0.5}, "finetune": {"fraction": 0.1}},
}
TARGET = {"tau": 0.7, "p": 0.01, "time": 0.30}  # issue #31: τ ≥ 0.7, p < 0.01, ≤ 30% of stand-alone


def permutation_p(a: list[float], b: list[float]) -> float:
    """Exact one-sided p-value: the share of orderings of ``b`` with τ at least the observed."""
    tau = kendall_tau(a, b)
    taus = [kendall_tau(a, list(p)) for p in itertools.permutations(b)]
    return sum(t >= tau - 1e-12 for t in taus) / len(taus)


def sampled_p(a: list[float], b: list[float], draws: int = 20000) -> float:
    """``permutation_p`` over random orderings, for too many candidates to list them all."""
    tau, rng, b, hits = kendall_tau(a, b), random.Random(0), list(b), 0
    for _ in range(draws):
        rng.shuffle(b)
        hits += kendall_tau(a, b) >= tau - 1e-12
    return (hits + 1) / (draws + 1)


def picks(ranked: list, per_end: int) -> list:
    """``per_end`` from the top, the middle and the bottom of a ranking."""
    n, mid = len(ranked), len(ranked) // 2
    idx = sorted({*range(per_end), *range(mid - per_end // 2, mid - per_end // 2 + per_end),
                  *range(n - per_end, n)})
    return [ranked[i] for i in idx]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--axis", choices=["placements", "loops"], default="placements",
                    help="placements: 2 of 6 layers attention; loops: (placement, k) of a looped pair")
    ap.add_argument("--steps", type=int, default=None, help="proxy steps: the supernet's and each "
                    "stand-alone run's (default 300 for placements, 400 for loops)")
    ap.add_argument("--pick", type=int, default=2, help="placements from each of top, middle, bottom")
    ap.add_argument("--noise", type=int, default=2, help="placements retrained at seed 1 (the first and "
                    "last picked, ...): the stand-alone seed noise (without --seeds)")
    ap.add_argument("--seeds", type=int, default=None, help="train each chosen sub-network at seeds "
                    "0..N-1 and rank by the mean")
    ap.add_argument("--supernet-steps", type=int, default=None, help="train the supernet this many "
                    "steps instead of --steps (the stand-alone runs keep --steps)")
    ap.add_argument("--kv-pairs", type=int, default=4, help="MQAR key-value pairs (placements axis)")
    ap.add_argument("--task", choices=["s3", "hop"], default="s3", help="the loops axis's proxy: the S3 word "
                    "problem, or 3-hop induction heads at the quickstart's width and lr")
    ap.add_argument("--all", action="store_true", help="train every candidate stand-alone, not a pick")
    ap.add_argument("--cache", type=Path, default=None, help="a JSON-lines file of stand-alone runs: a "
                    "(space, candidate, seed) found there is read, not retrained (runs are deterministic); "
                    "new runs are appended, so two processes can share the work")
    ap.add_argument("--reuse", type=Path, nargs="*", default=(), help="earlier results.json files whose "
                    "stand-alone runs count as cached")
    ap.add_argument("--reverse", action="store_true", help="train the candidates in reverse order (a "
                    "second process sharing --cache)")
    ap.add_argument("--remedy", nargs="+", choices=list(REMEDIES), default=None, help="run the one-shot "
                    "side once per remedy (none: none) against one stand-alone side; see --standalone-from")
    ap.add_argument("--standalone-from", default=None, help="with --remedy: the --write section whose "
                    "per-seed stand-alone values are reused")
    ap.add_argument("--verify", type=int, default=0, help="with --standalone-from: retrain this many of its "
                    "candidates at seed 0 (checks the values reproduce; times a stand-alone run now)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--write", type=Path, default=None, help="the results markdown to write")
    ap.add_argument("--render", type=Path, default=None, help="only write --write's section from this "
                    "results.json (e.g. of a run cut short)")
    ap.add_argument("--reanalyse", nargs="?", const=RESULT, type=Path, metavar="MD",
                    help="rewrite the re-analysis lines of a committed results file (default "
                         "results/oneshot_vs_standalone.md) from its per-seed columns; no training")
    args = ap.parse_args()
    if args.reanalyse is not None:
        args.reanalyse.write_text(reanalysed(args.reanalyse.read_text()))
        print(args.reanalyse)
        return
    if args.render is not None:
        report = json.loads(args.render.read_text())
        write_section(args.write, report["section"], seeded_markdown(report))
        return
    torch.set_num_threads(1)
    if args.remedy:
        run_remedies(args)
        return
    seeded = args.seeds is not None or args.axis == "loops"
    space = space_for(args)
    out = args.out or Path("runs/oneshot_vs_standalone" + (f"_{section_key(args)}" if seeded else ""))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))

    start = time.perf_counter()
    exp = run_sweep(out / "space.yaml", out=out / "oneshot", progress=False)
    oneshot_time = time.perf_counter() - start
    summary = json.loads((exp / "oneshot.json").read_text())
    trials = [t for t in read_trials(exp) if t.status == "complete"]
    ranked = sorted(trials, key=lambda t: t.values["eval_loss"])
    config = TrainConfig.model_validate({**space["proxy"], "seed": 0, "progress": False})
    if seeded:
        chosen = ranked if args.axis == "loops" or args.all else picks(ranked, args.pick)
        report = {"section": section_key(args), "axis": args.axis, "space": space, "argv": " ".join(sys.argv[1:]),
                  "oneshot_time": oneshot_time, "supernet_time": summary["supernet"]["wall_time"],
                  "eval_time": summary["search"]["wall_time"], "candidates": len(trials),
                  "supernet_final": summary["supernet"]["final"]}
        cache = Cache(args.cache, args.reuse, space)
        run_seeds(report, ranked, chosen, config, args.seeds or 1, out / "results.json", cache, args.reverse)
        if args.write is not None:
            write_section(args.write, report["section"], seeded_markdown(report))
        return
    rows = []
    for t in picks(ranked, args.pick):
        result = train(stored_spec(t.arch), config)
        rows.append({"placement": label(t), "rank": ranked.index(t) + 1, "oneshot_loss": t.values["eval_loss"],
                     "oneshot_acc": t.rungs[-1].metrics["acc"] if t.rungs else None,
                     "standalone_loss": result.final["eval_loss"], "standalone_acc": result.final["acc"],
                     "standalone_time": result.wall_time, "trial": t.id})
        print(json.dumps(rows[-1]), flush=True)
    noise = []
    for r in [rows[0], rows[-1], *rows[1:-1]][:args.noise] if len(rows) > 1 else rows[:args.noise]:
        again = train(stored_spec(next(t.arch for t in trials if t.id == r["trial"])),
                      config.model_copy(update={"seed": 1}))
        noise.append({"placement": r["placement"], "seed0": r["standalone_loss"], "seed1": again.final["eval_loss"],
                      "acc0": r["standalone_acc"], "acc1": again.final["acc"]})
        print(json.dumps(noise[-1]), flush=True)
    standalone_each = sum(r["standalone_time"] for r in rows) / len(rows)
    tau = kendall_tau([r["oneshot_loss"] for r in rows], [r["standalone_loss"] for r in rows])
    p = permutation_p([r["oneshot_loss"] for r in rows], [r["standalone_loss"] for r in rows])
    losses = [r["standalone_loss"] for r in rows]
    report = {"n": len(rows), "tau": tau, "p": p, "oneshot_time": oneshot_time,
              "supernet_time": summary["supernet"]["wall_time"], "eval_time": summary["search"]["wall_time"],
              "standalone_each": standalone_each, "standalone_all": standalone_each * len(trials),
              "placements": len(trials), "standalone_spread": max(losses) - min(losses), "rows": rows,
              "noise": noise,
              "steps": space["proxy"]["steps"], "supernet_final": summary["supernet"]["final"]}
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    if args.write is not None:
        args.write.write_text(markdown(report, " ".join(sys.argv[1:])))


def read_section(path: Path, key: str) -> dict[str, list[float]]:
    """Per-seed stand-alone eval losses of a seeded section: candidate → values."""
    text = path.read_text()
    body = text[text.index(f"<!-- section: {key} -->"):text.index(f"<!-- end: {key} -->")]
    out = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[1].startswith("`"):
            out[cells[1].strip("`")] = [float(v) for v in cells[5].split("/")]
    return out


def run_remedies(args) -> None:
    """The one-shot side per remedy against one stand-alone side (see the module docstring)."""
    from nas.oneshot import agreement

    base = space_for(args)
    out = args.out or Path(f"runs/oneshot_vs_standalone_{section_key(args)}-remedies")
    shutil.rmtree(out, ignore_errors=True)
    standalone = read_section(args.write, args.standalone_from)
    config = TrainConfig.model_validate({**base["proxy"], "seed": 0, "progress": False})
    report = {"section": section_key(args).replace(f"-seeds{args.seeds or 1}", "") + "-remedies", "space": base,
              "axis": args.axis,
              "argv": " ".join(sys.argv[1:]), "from": args.standalone_from, "verify": [], "remedies": []}
    for name in args.remedy:
        space = {**base, "oneshot": {**base["oneshot"], "remedy": REMEDIES[name]}}
        (out / name).mkdir(parents=True)
        (out / name / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
        start = time.perf_counter()
        exp = run_sweep(out / name / "space.yaml", out=out / name / "oneshot", progress=False)
        wall = time.perf_counter() - start
        summary = json.loads((exp / "oneshot.json").read_text())
        trials = {label(t): t for t in read_trials(exp) if t.status == "complete"}
        names = sorted(standalone)
        a = agreement([trials[c].values["eval_loss"] for c in names], [standalone[c] for c in names])
        report["remedies"].append({"remedy": name, "settings": REMEDIES[name], "wall_time": wall,
                                   "supernet_time": summary["supernet"]["wall_time"],
                                   "eval_time": summary["search"]["wall_time"],
                                   "oneshot": {c: trials[c].values["eval_loss"] for c in names},
                                   **a.to_dict()})
        print(json.dumps({k: v for k, v in report["remedies"][-1].items() if k != "oneshot"}), flush=True)
        (out / "results.json").write_text(json.dumps(report, indent=2))
    arch = {label(t): t.arch for t in read_trials(exp)}
    for c in sorted(standalone)[:args.verify]:
        result = train(stored_spec(arch[c]), config)
        report["verify"].append({"candidate": c, "seed": 0, "loss": result.final["eval_loss"],
                                 "committed": standalone[c][0], "time": result.wall_time})
        print(json.dumps(report["verify"][-1]), flush=True)
    report["standalone"] = standalone
    (out / "results.json").write_text(json.dumps(report, indent=2))
    if args.write is not None:
        write_section(args.write, report["section"], remedies_markdown(report))


def remedies_markdown(r: dict) -> str:
    """The section of a ``--remedy`` run: one row per remedy, then the scores behind them."""
    names, rows = sorted(r["standalone"]), r["remedies"]
    seeds = len(r["standalone"][names[0]])
    each = statistics.fmean(v["time"] for v in r["verify"]) if r["verify"] else None
    one_seed = each * len(names) if each else None
    axis, task = r.get("axis", "loops"), r["space"]["proxy"]["task"]
    what = ("loop counts (and order) on " + ("hop induction" if task == "hop_induction" else "the S3 word problem")
            if axis == "loops" else "attention placements on MQAR")
    lines = [f"## One-shot remedies vs stand-alone, {what}", "",
             f"Command: `python experiments/oneshot_vs_standalone.py {r['argv']}`", "", setting(
                 {**r, "axis": axis, "candidates": len(names), "rows": names}),
             f"Stand-alone: the per-seed eval losses of section `{r['from']}` ({len(names)} candidates × "
             f"{seeds} seeds), not retrained; "
             + (", ".join(f"`{v['candidate']}` seed 0 retrained now: {v['loss']:.4f} (committed {v['committed']:.3f}, "
                          f"{v['time']:.0f} s)" for v in r["verify"]) + "." if r["verify"] else "none retrained."),
             f"A stand-alone run takes {each:.0f} s now (the mean of those), so training every candidate once takes "
             f"{one_seed:.0f} s and {seeds} seeds each {one_seed * seeds:.0f} s." if each else "",
             "τ: Kendall τ of one-shot eval loss against the stand-alone mean, its 95% interval resampling the "
             "stand-alone seeds, exact one-sided permutation p (`nas.oneshot.agreement`, the self-check's). "
             f"Target (issue #31): τ ≥ {TARGET['tau']}, p < {TARGET['p']}, at ≤ {TARGET['time']:.0%} of the "
             "stand-alone wall time.", "",
             "| remedy | settings | τ | 95% interval | p | n | seeds | one-shot wall time | of 1 seed each | "
             f"of {seeds} seeds each | target |",
             "|:---|:---|---:|:---|---:|---:|---:|---:|---:|---:|:---|"]
    for x in rows:
        frac = x["wall_time"] / one_seed if one_seed else None
        hit = (x["tau"] is not None and x["tau"] >= TARGET["tau"] and x["p"] < TARGET["p"]
               and frac is not None and frac <= TARGET["time"])
        lines.append(f"| {x['remedy']} | `{json.dumps(x['settings']) if x['settings'] else '–'}` | {x['tau']:.3f} | "
                     f"{x['tau_ci'][0]:.2f} to {x['tau_ci'][1]:.2f} | {x['p']:.3f} | {x['n']} | {x['seeds']} | "
                     f"{x['wall_time']:.0f} s (supernet {x['supernet_time']:.0f} s) | "
                     + (f"{frac:.0%} | {frac / seeds:.0%}" if frac else "– | –") + f" | {'met' if hit else 'not met'} |")
    lines += ["", "One-shot eval loss of every candidate under each remedy (lower is better), beside the "
              "stand-alone mean:", "",
              "| candidate | stand-alone mean | " + " | ".join(x["remedy"] for x in rows) + " |",
              "|:---|---:|" + "---:|" * len(rows)]
    for c in sorted(names, key=lambda c: statistics.fmean(r["standalone"][c])):
        lines.append(f"| `{c}` | {statistics.fmean(r['standalone'][c]):.3f} | "
                     + " | ".join(f"{x['oneshot'][c]:.4f}" for x in rows) + " |")
    return "\n".join(l for l in lines) + "\n"


def space_for(args) -> dict:
    """The experiment's one-shot space: the axis's, at ``--steps`` (and ``--kv-pairs``)."""
    if args.axis == "loops":
        base = HOP_LOOP_SPACE if args.task == "hop" else LOOP_SPACE
        space = {**base, "proxy": {**base["proxy"], "steps": args.steps or 400}}
    else:
        params = {**SPACE["proxy"]["task_params"], "num_kv_pairs": args.kv_pairs}
        space = {**SPACE, "proxy": {**SPACE["proxy"], "steps": args.steps or 300, "task_params": params}}
    if args.supernet_steps is not None:
        space["oneshot"] = {**space["oneshot"], "train": {"steps": args.supernet_steps}}
    return space


def section_key(args) -> str:
    kv = (f"-kv{args.kv_pairs}" if args.axis == "placements" else "-hop" if args.task == "hop" else "")
    kv += "-all" if args.all else ""
    sup = f"-supernet{args.supernet_steps}" if args.supernet_steps is not None else ""
    return (f"{args.axis}{kv}-steps{args.steps or (400 if args.axis == 'loops' else 300)}{sup}"
            f"-seeds{args.seeds or 1}")


def label(t) -> str:
    """``AggggA`` (A = attention, g = GDN), and ``k=3`` with a searched loop count."""
    names = [t.params[f"layer{i}"] for i in range(sum(k.startswith("layer") for k in t.params))]
    text = "".join("A" if n == "attn" else "g" for n in names)
    return text + (f" k={t.params['T']}" if "T" in t.params else "")


class Cache:
    """Stand-alone runs already made, keyed by (space base, proxy, candidate, seed)."""

    def __init__(self, path: Path | None, reuse, space: dict):
        self.path, self.space, self.runs, self.hits = path, space, {}, 0
        for old in reuse:
            r = json.loads(Path(old).read_text())
            for row in r["rows"]:
                for seed, (loss, acc, t) in enumerate(zip(row["loss"], row["acc"], row["time"])):
                    self.runs[self.key(r["space"], row["candidate"], seed)] = {"loss": loss, "acc": acc, "time": t}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                self.runs[entry["key"]] = entry["run"]

    @staticmethod
    def key(space: dict, candidate: str, seed: int) -> str:
        return json.dumps([space["base"], space["proxy"], candidate, seed], sort_keys=True)

    def get(self, candidate: str, seed: int) -> dict | None:
        if self.path is not None and self.path.exists():  # another process may have added it
            self._refresh()
        run = self.runs.get(self.key(self.space, candidate, seed))
        self.hits += run is not None
        return run

    def _refresh(self) -> None:
        for line in self.path.read_text().splitlines():
            entry = json.loads(line)
            self.runs.setdefault(entry["key"], entry["run"])

    def put(self, candidate: str, seed: int, run: dict) -> None:
        key = self.key(self.space, candidate, seed)
        self.runs[key] = run
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "run": run}) + "\n")


def run_seeds(report: dict, ranked: list, chosen: list, config: TrainConfig, seeds: int, path: Path,
              cache: Cache, reverse: bool = False) -> None:
    """Train every chosen sub-network at seeds 0..seeds-1 (seed-major, so that a run cut
    short has whole seeds), writing ``path`` after every run; then the statistics."""
    rows = [{"candidate": label(t), "rank": ranked.index(t) + 1, "oneshot_loss": t.values["eval_loss"],
             "oneshot_acc": t.rungs[-1].metrics.get("acc") if t.rungs else None, "trial": t.id,
             "loss": [None] * seeds, "acc": [None] * seeds, "time": [None] * seeds} for t in chosen]
    report["rows"] = rows
    order = [(seed, i) for seed in range(seeds) for i in range(len(chosen))]
    for seed, i in (order[::-1] if reverse else order):
        t, r = chosen[i], rows[i]
        run = cache.get(r["candidate"], seed)
        if run is None:
            result = train(stored_spec(t.arch), config.model_copy(update={"seed": seed}))
            run = {"loss": result.final["eval_loss"], "acc": result.final["acc"], "time": result.wall_time}
            cache.put(r["candidate"], seed, run)
        r["loss"][seed], r["acc"][seed], r["time"][seed] = run["loss"], run["acc"], run["time"]
        print(json.dumps({"seed": seed, "candidate": r["candidate"], "rank": r["rank"], **run}), flush=True)
        if all(x["loss"][0] is not None for x in rows):
            report.update(statistics_of(rows))
        report["reused"] = cache.hits
        path.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("rows", "space")}, indent=2))


def statistics_of(rows: list[dict]) -> dict:
    """τ of the one-shot loss against the stand-alone mean; whether the stand-alone
    candidates differ beyond seed noise; the wall-clock of training every candidate."""
    done = min(next((s for s, v in enumerate(r["loss"]) if v is None), len(r["loss"])) for r in rows)
    loss = [r["loss"][:done] for r in rows]
    means = [statistics.fmean(x) for x in loss]
    for r, m, x in zip(rows, means, loss):
        r["mean"], r["se"] = m, statistics.stdev(x) / len(x) ** 0.5 if len(x) > 1 else None
        r["acc_mean"] = statistics.fmean(r["acc"][:done])
    oneshot = [r["oneshot_loss"] for r in rows]
    out = {"n": len(rows), "seeds_done": done, "tau": kendall_tau(oneshot, means),
           "p": permutation_p(oneshot, means) if len(rows) <= 9 else sampled_p(oneshot, means),
           "spread": max(means) - min(means),
           "standalone_each": statistics.fmean(t for r in rows for t in r["time"][:done])}
    if done > 1:
        f, p_f = anova_permutation(loss)
        per_seed = [[x[s] for x in loss] for s in range(done)]
        out.update(anova_f=f, anova_p=p_f,
                   seed_sd=statistics.fmean(statistics.variance(x) for x in loss) ** 0.5,
                   seed_tau=statistics.fmean(kendall_tau(a, b) for a, b in itertools.combinations(per_seed, 2)),
                   tau_per_seed=[kendall_tau(oneshot, s) for s in per_seed])
    return out


def anova_f(groups: list[list[float]]) -> float:
    """One-way ANOVA F: between-candidate over within-candidate (seed) mean squares."""
    k, n = len(groups), sum(len(g) for g in groups)
    grand = statistics.fmean(x for g in groups for x in g)
    between = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in groups) / (k - 1)
    within = sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g) / (n - k)
    return between / within if within > 0 else float("inf")


def anova_permutation(groups: list[list[float]], draws: int = 20000) -> tuple[float, float]:
    """F and its permutation p-value: the share of random relabellings of the runs (which
    candidate each belongs to) with an F at least the observed (no normality assumed)."""
    f = anova_f(groups)
    pool, sizes, rng, hits = [x for g in groups for x in g], [len(g) for g in groups], random.Random(0), 0
    for _ in range(draws):
        rng.shuffle(pool)
        it = iter(pool)
        hits += anova_f([[next(it) for _ in range(s)] for s in sizes]) >= f - 1e-12
    return f, (hits + 1) / (draws + 1)


def write_section(path: Path, key: str, text: str) -> None:
    """Replace (or append) the section of ``path`` between this key's markers."""
    begin, end = f"<!-- section: {key} -->", f"<!-- end: {key} -->"
    old = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end) + 1:]
    else:
        new = old.rstrip() + "\n\n" + block
    path.write_text(new)


def markdown(r: dict, argv: str) -> str:
    saving = 1 - r["oneshot_time"] / r["standalone_all"]
    agree = ("agrees with" if r["tau"] > 0 and r["p"] < 0.05 else
             "does not detectably agree with" if r["tau"] <= 0 or r["p"] >= 0.05 else "")
    lines = [
        "# One-shot ranking vs stand-alone training", "",
        f"Command: `python experiments/oneshot_vs_standalone.py {argv}`", "",
        f"Space: 2 of 6 layers softmax attention, 4 GDN (width 32, SwiGLU 64), {r['placements']} "
        f"placements; MQAR (vocab 64, 32 tokens, 4 key-value pairs); {r['steps']} steps, batch 16, "
        "lr 0.01, for the supernet and for every stand-alone run; quality = eval loss on 8 fixed "
        "eval batches (lower is better). The supernet samples a placement with exactly 2 attention "
        "layers at every forward pass (ratio-constrained, PostNAS); all placements are scored with "
        "its weights (exhaustive search), then the top, middle and bottom of that ranking are "
        "trained stand-alone from scratch (seed 0).", "",
        "| one-shot rank | placement (A = attention) | one-shot eval loss | stand-alone eval loss | stand-alone acc |",
        "|---:|:---|---:|---:|---:|",
    ]
    lines += [f"| {x['rank']} | `{x['placement']}` | {x['oneshot_loss']:.4f} | {x['standalone_loss']:.4f} | "
              f"{x['standalone_acc']:.3f} |" for x in r["rows"]]
    lines += [
        "",
        f"- **Kendall τ = {r['tau']:.3f}** over {r['n']} placements (exact one-sided permutation "
        f"p = {r['p']:.3f}).",
        f"- Spread of the stand-alone losses over these placements: {r['standalone_spread']:.4f}.",
        *[f"- Seed noise: `{n['placement']}` stand-alone at seed 0 / seed 1: eval loss {n['seed0']:.4f} / "
          f"{n['seed1']:.4f} (acc {n['acc0']:.3f} / {n['acc1']:.3f}); |Δ| = {abs(n['seed0'] - n['seed1']):.4f}."
          for n in r["noise"]],
        f"- Wall-clock: the one-shot search took {r['oneshot_time']:.0f} s (supernet "
        f"{r['supernet_time']:.0f} s, {r['placements']} evaluations {r['eval_time']:.0f} s); one stand-alone "
        f"run takes {r['standalone_each']:.0f} s, so all {r['placements']} would take "
        f"{r['standalone_all']:.0f} s: a saving of {saving:.0%}.",
        "",
        f"What it says: at this scale the one-shot ranking {agree} stand-alone training "
        f"(τ = {r['tau']:.2f}, p = {r['p']:.2f}, n = {r['n']}).",
    ]
    return "\n".join(lines) + "\n"



def setting(r: dict) -> str:
    proxy, tp = r["space"]["proxy"], r["space"]["proxy"]["task_params"]
    sup = r["space"]["oneshot"].get("train", {}).get("steps")
    run = (f"{proxy['steps']} steps, batch {proxy['batch_size']}, lr {proxy['lr']}, for "
           + (f"every stand-alone run and {sup} steps for the supernet" if sup else "the supernet and every stand-alone run"))
    if r["axis"] == "loops" and proxy["task"] == "hop_induction":
        return (f"Space: a GDN layer and a softmax-attention layer (width 64, SwiGLU 128) looped together as one "
                f"block (shared zero-initialised residual gate), both orders × loop counts k = 1–4: "
                f"{r['candidates']} candidates. The supernet has a switch in each layer (ratio-constrained: one "
                f"of each) and elastic loop counts 1–4 drawn inside every update. Task: {tp['k']}-hop induction "
                f"heads (n = {tp['n']}, alphabet {tp['alphabet_size']}, chance 0.25); {run}.")
    if r["axis"] == "loops":
        return (f"Space: a GDN layer and a softmax-attention layer (width 32, SwiGLU 64) looped together as one "
                f"block (shared zero-initialised residual gate), both orders × loop counts k = 1–4: "
                f"{r['candidates']} candidates. The supernet has a switch in each layer (ratio-constrained: one "
                f"of each) and elastic loop counts 1–4 drawn inside every update. Task: S3 word problem "
                f"(running product of {tp['seq_len']} permutations of 3 elements, chance 1/6 = 0.167); {run}.")
    return (f"Space: 2 of 6 layers softmax attention, 4 GDN (width 32, SwiGLU 64), {r['candidates']} placements; "
            f"ratio-constrained supernet (PostNAS). Task: MQAR (vocab {tp['vocab_size']}, {tp['seq_len']} tokens, "
            f"{tp['num_kv_pairs']} key-value pairs); {run}. "
            + ("Every placement is trained stand-alone." if len(r["rows"]) == r["candidates"] else
               "The top, middle and bottom of the one-shot ranking are trained stand-alone."))


def seeded_markdown(r: dict) -> str:
    """A results section of a seeded run (``--seeds`` / ``--axis loops``)."""
    done = r["seeds_done"]
    title = "loop counts (and order)" if r["axis"] == "loops" else (
        "every attention placement" if len(r["rows"]) == r["candidates"] else "attention placements, top/middle/bottom")
    sup = r["space"]["oneshot"].get("train", {}).get("steps")
    title += f", supernet {sup} steps" if sup else ""
    # every candidate once: the chosen ones' mean time each, times the candidates
    r = {**r, "standalone_one_seed": statistics.fmean(statistics.fmean(x["time"][:done]) for x in r["rows"])
         * r["candidates"]}
    saving = 1 - r["oneshot_time"] / r["standalone_one_seed"]
    lines = [f"## One-shot vs stand-alone, {title}, {done} seed{'s' * (done > 1)}", "",
             f"Command: `python experiments/oneshot_vs_standalone.py {r['argv']}`", "", setting(r),
             f"Quality = eval loss on {r['space']['proxy']['eval_batches']} fixed eval batches (lower is better); "
             "stand-alone = mean over "
             f"seeds 0–{done - 1} ± standard error.", "",
             "| one-shot rank | candidate (A = attention) | one-shot eval loss | one-shot acc | stand-alone eval loss "
             "(mean ± s.e.) | per seed | stand-alone acc (mean) |",
             "|---:|:---|---:|---:|---:|:---|---:|"]
    for x in r["rows"]:
        se = f" ± {x['se']:.4f}" if x.get("se") is not None else ""
        acc = f"{x['oneshot_acc']:.3f}" if x["oneshot_acc"] is not None else "–"
        lines.append(f"| {x['rank']} | `{x['candidate']}` | {x['oneshot_loss']:.4f} | {acc} | {x['mean']:.4f}{se} | "
                     + " / ".join(f"{v:.3f}" for v in x["loss"][:done]) + f" | {x['acc_mean']:.3f} |")
    p = (f"exact one-sided permutation p = {r['p']:.3f}" if r["n"] <= 9 else
         f"one-sided permutation p = {r['p']:.4f} over 20,000 random orderings")
    lines += ["", f"- **Kendall τ = {r['tau']:.3f}** (one-shot loss vs stand-alone mean loss) over {r['n']} "
              f"candidates ({p})."]
    if done > 1:
        lines += [
            f"- Do the stand-alone candidates differ beyond seed noise? One-way ANOVA over the {r['n']} × {done} "
            f"runs: F = {r['anova_f']:.2f}, permutation p = {r['anova_p']:.4f}. Spread of the means "
            f"{r['spread']:.4f} against a seed standard deviation of {r['seed_sd']:.4f} (a mean's s.e. "
            f"≈ {r['seed_sd'] / done ** 0.5:.4f}).",
            f"- Stand-alone training against itself: mean τ between single seeds' rankings = {r['seed_tau']:.3f} "
            "(the ceiling for any proxy's agreement with one seed); τ of the one-shot ranking against each "
            "seed alone: " + ", ".join(f"{t:.2f}" for t in r["tau_per_seed"]) + "."]
    lines += [
        f"- Wall-clock: the one-shot search took {r['oneshot_time']:.0f} s (supernet {r['supernet_time']:.0f} s, "
        f"{r['candidates']} evaluations {r['eval_time']:.0f} s); training all {r['candidates']} candidates "
        f"stand-alone once would take {r['standalone_one_seed']:.0f} s (mean run {r['standalone_each']:.0f} s): "
        f"a saving of {saving:.0%} ({saving_with_seeds(r, done)}).",
        *([f"- {r['reused']} of the {r['n'] * done} stand-alone runs were read from earlier runs of the same "
            "settings (`--reuse`/`--cache`; runs are deterministic), not retrained; their times are those "
            "runs' own."] if r.get("reused") else []),
        ""]
    if done > 1:  # the library's statistics, from the values as printed (as --reanalyse redoes them)
        lines[-1:-1] = reanalysis_lines("\n".join(lines))
    lines += ["What it says: " + verdict(r), ""]
    return "\n".join(lines)


def saving_with_seeds(r: dict, done: int) -> str:
    return f"{1 - r['oneshot_time'] / (r['standalone_one_seed'] * done):.0%} against {done} seeds each"


def verdict(r: dict) -> str:
    """The plain reading, from the numbers alone."""
    agree = r["p"] is not None and r["tau"] > 0 and r["p"] < 0.05
    noisy = r.get("anova_p") is not None and r["anova_p"] >= 0.05
    if noisy:
        return (f"the stand-alone candidates are not distinguishable from seed noise (ANOVA p = "
                f"{r['anova_p']:.2f}), so this proxy cannot test the one-shot ranking (τ = {r['tau']:.2f}"
                + (f", p = {r['p']:.2f}" if r["p"] is not None else "") + ").")
    sep = (f"the stand-alone candidates do differ beyond seed noise (ANOVA p = {r['anova_p']:.2g}); "
           if r.get("anova_p") is not None else "")
    if agree:
        return sep + f"the one-shot ranking agrees with stand-alone training (τ = {r['tau']:.2f}, p = {r['p']:.3f}, n = {r['n']})."
    return (sep + f"the one-shot ranking does not detectably agree with stand-alone training (τ = {r['tau']:.2f}"
            + (f", p = {r['p']:.2f}" if r["p"] is not None else "") + f", n = {r['n']}).")


# ---- --reanalyse: the committed sections from their per-seed columns (issue #29) -----------

RESULT = Path(__file__).resolve().parent / "results" / "oneshot_vs_standalone.md"
REANALYSIS = "- Re-analysed (issue #29"
DIFFER_ALPHA = 0.01  # "the stand-alone candidates differ": Holm p below this (calibrate's level)


def seeded_table(text: str) -> list[tuple[str, float, list[float]]]:
    """(candidate, one-shot eval loss, per-seed stand-alone eval losses) of a seeded section's
    table, as printed (3 decimals: the raw values are not kept elsewhere)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 7 and cells[1].startswith("`"):
            out.append((cells[1].strip("`"), float(cells[2]), [float(v) for v in cells[5].split("/")]))
    return out


def _old_decisions(text: str) -> tuple[bool | None, bool]:
    """(the candidates differ, the ranking agrees) as the section's own lines decided them
    (ANOVA permutation p < 0.05; τ > 0 and its p < 0.05)."""
    anova = re.search(r"permutation p = ([0-9.]+)\. Spread", text)
    tau = re.search(r"Kendall τ = (-?[0-9.]+)\*\* .*?p = ([0-9.]+)", text)
    differ = None if anova is None else float(anova.group(1)) < 0.05
    return differ, float(tau.group(1)) > 0 and float(tau.group(2)) < 0.05


def _k(candidate: str) -> tuple[str, int] | None:
    m = re.fullmatch(r"(\w+) k=(\d+)", candidate)
    return (m.group(1), int(m.group(2))) if m else None


def reanalysis_lines(text: str) -> list[str]:
    """The re-analysis of one seeded section (its text), from its per-seed columns:
    the candidates' differences by ``nas.noise.permutation_test`` paired by seed, the
    agreement by ``nas.oneshot.agreement`` (τ, its interval over seeds, one-sided p), both
    Holm-adjusted over the section's two decisions; on the loops axis, each loop count against
    k = 1 within an order (``nas.noise.compare``, paired by seed, Holm over them) and the
    order (``permutation_test`` with k as context)."""
    from nas.noise import compare, holm, p_text, permutation_test
    from nas.oneshot import AGREE_ALPHA, agreement

    rows = seeded_table(text)
    seeds = len(rows[0][2])
    by_name = sorted(rows)  # the Monte Carlo stream must not depend on the one-shot order
    differ = permutation_test([[v for _, _, v in by_name]], [[list(range(seeds))] * len(by_name)],
                              alpha=DIFFER_ALPHA)
    agree = agreement([o for _, o, _ in rows], [v for _, _, v in rows])
    h_differ, h_agree = holm([differ.p_upper, agree.p])
    differs = h_differ < DIFFER_ALPHA
    agrees = agree.tau > 0 and h_agree < AGREE_ALPHA
    old_differs, old_agrees = _old_decisions(text)
    lines = [f"{REANALYSIS}, `nas.noise`, from the per-seed values above; Holm over this section's two "
             f"decisions): the stand-alone candidates differ by a {differ.test}: "
             f"{p_text(differ.p, differ.floor, differ.exact, differ.p_upper)}, Holm {h_differ:.2g}; "
             f"τ = {agree.tau:.3f} (95% interval over seeds {agree.lo:.2f} to {agree.hi:.2f}; one-sided "
             f"permutation p = {agree.p:.3g}, `nas.oneshot.agreement`), Holm {h_agree:.2g}. Decided at Holm "
             f"p < {DIFFER_ALPHA:g}: the candidates {'differ' if differs else 'are within seed noise'}, the "
             f"ranking {'agrees' if agrees else 'does not agree'}; "
             + ("the verdict below is unchanged." if (old_differs, old_agrees) == (differs, agrees) else
                f"**changed** from the verdict below (which read differ = {old_differs}, agree = "
                f"{old_agrees} at p < 0.05 unadjusted).")]
    ks = {c: _k(c) for c, _, _ in rows}
    if all(ks.values()):
        vals = {ks[c]: v for c, _, v in rows}
        orders = sorted({o for o, _ in vals})
        counts = sorted({k for _, k in vals})
        tests = [(o, k, compare(vals[(o, k)], vals[(o, counts[0])], list(range(seeds)), list(range(seeds))))
                 for o in orders for k in counts[1:] if (o, k) in vals and (o, counts[0]) in vals]
        adjusted = holm([t.p for _, _, t in tests])
        lines.append(f"- Loop counts within an order, each against k = {counts[0]} (paired t-test over {seeds} "
                     f"seeds, Holm over {len(tests)}): "
                     + "; ".join(f"`{o}` k={k} {t.diff:+.3f} ± {t.se:.3f}, p = {t.p:.3g}, Holm {a:.2g}"
                                 + (" (separated)" if a < 0.05 else "")
                                 for (o, k, t), a in zip(tests, adjusted)) + ".")
        order = permutation_test([[vals[(o, k)] for o in orders] for k in counts],
                                 [[list(range(seeds))] * len(orders) for _ in counts], alpha=DIFFER_ALPHA)
        lines.append(f"- Order ({' vs '.join(f'`{o}`' for o in orders)}) with the loop count as context: "
                     f"{order.test}, {p_text(order.p, order.floor, order.exact, order.p_upper)}.")
    return lines


def single_seed_line(text: str) -> str:
    """The first (one-seed) section: τ by ``nas.oneshot.agreement``; nothing paired to test."""
    from nas.oneshot import agreement

    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and cells[1].startswith("`"):
            rows.append((float(cells[2]), float(cells[3])))
    a = agreement([o for o, _ in rows], [[s] for _, s in rows])
    return (f"{REANALYSIS}): one seed per placement, so no test of the stand-alone differences is "
            f"possible and none was redone; `nas.oneshot.agreement` gives the same τ = {a.tau:.3f} and exact "
            f"one-sided p = {a.p:.3f} from the table.")


def reanalysed(text: str) -> str:
    """The results file with every section's re-analysis lines (re)written."""
    lines = [line for line in text.splitlines() if not line.startswith(REANALYSIS)
             and not line.startswith("- Loop counts within an order") and not line.startswith("- Order (`")]
    text = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    first = text.index("\n## ")
    head = text[:first]
    at = head.index("- Wall-clock:")
    text = head[:at] + single_seed_line(head) + "\n" + head[at:] + text[first:]
    for key in re.findall(r"<!-- section: (\S+) -->", text):
        begin, end = f"<!-- section: {key} -->", f"<!-- end: {key} -->"
        a, b = text.index(begin), text.index(end)
        body = text[a:b]
        if not seeded_table(body) or "\nWhat it says:" not in body:
            continue
        at = body.index("\n\nWhat it says:")
        body = body[:at] + "\n" + "\n".join(reanalysis_lines(body)) + body[at:]
        text = text[:a] + body + text[b:]
    return text


if __name__ == "__main__":
    main()
