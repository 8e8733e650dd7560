"""Is hop_induction a proxy on which loops matter (issue 19)? Train the quickstart's one-layer,
width-64, parameter-matched candidates (GDN and softmax attention; no loop, FullLoop T=2/4,
MixerLoop T=4, residual gate shared) on ``hop_induction`` at several seeds, and print final
accuracy per seed, mean ± standard error, seconds per run, and whether each looped candidate
separates from the unlooped one of its mixer beyond seed noise: ``nas.noise.compare`` (a
paired t-test over the shared seeds), Holm-adjusted over the run's looped-vs-unlooped
comparisons, separated when the adjusted p < ``nas.noise.TIE_ALPHA`` (issue #29; before, the
rule was "every looped seed above every unlooped one and the difference above 3 s.e.").

    python experiments/hop_pilot.py --steps 800 --n 32 --k 3 --eval-batches 32
    python experiments/hop_pilot.py --steps 300 --n 16 --mixers gdn --json-out out.jsonl
    python experiments/hop_pilot.py --reanalyse     # results/hop_pilot.md from its per-seed columns

``--reanalyse`` redoes every committed table's comparisons from the per-seed accuracies the
table prints (3 decimals: the raw values were not kept otherwise) and rewrites its analysis
columns and the line under it (GDN's loop gain against attention's, per seed);
``tests/project/test_experiment_reanalysis.py`` checks the committed file is what it gives.

Candidates are built exactly as a sweep trial of ``experiments/spaces/hop_pilot.yaml`` (the
quickstart's layout when the pilot ran: same lowering and parameter matching); only the proxy (task, steps, lr, eval batches) is replaced. Every
run evaluates on the same fixed eval batches (``eval_seed``), as a sweep's replicates do.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import optuna
import torch

from nas.noise import TIE_ALPHA, PairTest, compare, holm, mean_se
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


def separation(looped: list[float], base: list[float], seeds: list[int]) -> PairTest:
    """Looped against unlooped at the same seeds: ``nas.noise.compare``, paired by seed."""
    return compare(looped, base, seeds, seeds)


def separated_text(t: PairTest, adjusted: float, alpha: float = TIE_ALPHA) -> str:
    """The verdict: "above" / "below" (adjusted p < alpha, by the sign of the difference) or "no"."""
    if not adjusted < alpha:
        return "no"
    return "above" if t.diff > 0 else "below"


def old_rule(looped: list[float], base: list[float]) -> tuple[float, float, bool]:
    """The rule before issue #29: (difference of means, its unpaired standard error,
    min(looped) > max(base) and difference > 3 s.e.)."""
    (m1, s1), (m0, s0) = mean_se(looped), mean_se(base)
    diff, se = m1 - m0, (s1**2 + s0**2) ** 0.5
    return diff, se, min(looped) > max(base) and diff > 3 * se


# ---- --reanalyse: the committed tables from their per-seed columns ------------------------

RESULT = Path(__file__).resolve().parent / "results" / "hop_pilot.md"
COLUMNS = ("paired t p", "Holm p", f"separated now (Holm p < {TIE_ALPHA:g})")
OLD = "separated"
OLD_NOW = "3-s.e. rule (before #29)"
GAIN = "- GDN's loop gain minus attention's"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table_tests(rows: dict[str, list[float]], seeds: list[int]) -> dict[str, tuple[PairTest, float]]:
    """Every looped candidate of a table against its mixer's unlooped one: the paired test and
    its Holm-adjusted p over the table's comparisons."""
    pairs = [(name, rows[name], rows[name.split(", ")[0] + ", none"]) for name in rows
             if not name.endswith(", none") and name.split(", ")[0] + ", none" in rows]
    tests = [separation(looped, base, seeds) for _, looped, base in pairs]
    return {name: (t, a) for (name, _, _), t, a in zip(pairs, tests, holm([t.p for t in tests]))}


def gain_tests(rows: dict[str, list[float]], seeds: list[int]) -> list[tuple[str, PairTest, float]]:
    """For each loop both mixers ran: GDN's per-seed loop gain against attention's (paired by
    seed), Holm-adjusted over the table's loops."""
    loops = [name.split(", ")[1] for name in rows if name.startswith("gdn, ") and not name.endswith(", none")
             and "attn, " + name.split(", ")[1] in rows and "attn, none" in rows]
    gains = {m: {lp: [a - b for a, b in zip(rows[f"{m}, {lp}"], rows[f"{m}, none"])] for lp in loops}
             for m in ("gdn", "attn")}
    tests = [compare(gains["gdn"][lp], gains["attn"][lp], seeds, seeds) for lp in loops]
    return list(zip(loops, tests, holm([t.p for t in tests])))


def _p(p: float) -> str:
    return f"{p:.3g}"


def reanalysed(text: str) -> str:
    """``text`` (results/hop_pilot.md) with every table's analysis columns and loop-gain line
    recomputed from its per-seed columns."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("| candidate |") and i + 1 < len(lines) and lines[i + 1].startswith("|---")):
            out.append(line)
            i += 1
            continue
        head = _cells(line)
        head = [OLD_NOW if h == OLD else h for h in head]
        if COLUMNS[0] not in head:
            at = head.index(OLD_NOW) + 1
            head[at:at] = list(COLUMNS)
        seed_cols = [j for j, h in enumerate(head) if re.fullmatch(r"seed \d+", h)]
        seeds = [int(head[j].split()[1]) for j in seed_cols]
        body, i = [], i + 2
        while i < len(lines) and lines[i].startswith("|"):
            cells = _cells(lines[i])
            if len(cells) == len(head) - len(COLUMNS):
                at = head.index(OLD_NOW) + 1
                cells[at:at] = [""] * len(COLUMNS)
            body.append(cells)
            i += 1
        rows = {c[0]: [float(c[j]) for j in seed_cols] for c in body}
        tests = table_tests(rows, seeds)
        for c in body:
            t = tests.get(c[0])
            cols = [_p(t[0].p), _p(t[1]), separated_text(*t)] if t else ["", "", ""]
            for name, value in zip(COLUMNS, cols):
                c[head.index(name)] = value
        out += [_row(head), "|" + "---|" * len(head), *(_row(c) for c in body)]
        gains = gain_tests(rows, seeds)
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(GAIN)):
            i += 1  # the blank lines and the old loop-gain line
        out.append("")
        if gains:
            out += [f"{GAIN}, per seed (paired t-test over {len(seeds)} seeds, Holm over {len(gains)}): "
                    + "; ".join(f"{lp} {t.diff:+.3f} ± {t.se:.3f}, p = {_p(t.p)}, Holm {_p(a)}"
                                for lp, t, a in gains) + ".", ""]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


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
    ap.add_argument("--reanalyse", nargs="?", const=RESULT, type=Path, metavar="MD",
                    help="rewrite the analysis of a committed results file (default results/hop_pilot.md) "
                         "from its per-seed columns; no training")
    args = ap.parse_args()
    if args.reanalyse:
        args.reanalyse.write_text(reanalysed(args.reanalyse.read_text()))
        print(args.reanalyse)
        return
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
    tests = table_tests({f"{m}, {lp}": v for (m, lp), v in rows.items()}, args.seeds)
    for name, (t, adjusted) in tests.items():
        print(f"{name} - none: {t.diff:+.3f} ± {t.se:.3f} ({t.test}), p = {_p(t.p)}, Holm {_p(adjusted)}: "
              f"{'separated, ' + separated_text(t, adjusted) if adjusted < TIE_ALPHA else 'within noise'}")

if __name__ == "__main__":
    main()
