"""Sweep benchmark: backend scheduling overhead, early-stopping saving and front recall,
rank agreement of each rung with the final budget.

    python benchmarks/bench_sweep.py                       # full run (~10 min on 2 idle cores)
    python benchmarks/bench_sweep.py --quick --backends optuna --results /tmp/r   # the test's run

1. **Scheduling overhead** per backend: sweep wall time / ideal, ideal = (sum of the trials'
   own wall times) / concurrency. ``--trials`` (8) distinct candidates of one architecture
   (they differ only in ``proxy.warmup_steps``, so every one trains and none is a duplicate),
   sized to ``--trial-seconds`` (20) each at one thread: the steps are calibrated from the CPU
   time per step measured in this process, so a trial lasts about that long on an idle machine.
   Sweep wall time is the whole ``run_sweep`` call (for ray: start-up and shutdown included).
   Targets (issue 8): ray <= 1.25, optuna <= 1.10.
2. **Early stopping**: the ES space (``--es-space``, default ``benchmarks/spaces/bench_es.yaml``)
   runs twice on the grid sampler (identical candidates): full budget, then with
   ``search.early_stopping`` (Pareto-aware halving, rungs at ``--rungs`` fractions of the steps,
   ``--margin``). Compute of a trial = projection FLOPs/token x optimizer steps it trained
   (all candidates share batch and sequence length); saving = 1 - ES/full. Recall = fraction of
   the full-budget front's members (by canonical spec hash) on the ES run's front; "kept" =
   fraction not stopped. Target: >= 60 % saved at >= 95 % recall.
3. **Rank agreement**: Kendall tau-b between each evaluation's quality and the final quality,
   over the full-budget run's complete trials (scipy if importable, else the same formula here).

Writes ``--results``/bench_sweep.md and .json (default benchmarks/results/; ``--quick`` writes
bench_sweep_quick.*).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ES_SPACE = ROOT / "benchmarks" / "spaces" / "bench_es.yaml"
sys.path.insert(0, str(ROOT))
from nas.noise import kendall_tau  # noqa: E402  (Kendall's τ-b: one definition)

# One small attention model: the same architecture in every overhead trial.
OVERHEAD_BASE = {
    "name": "bench_overhead",
    "model": {"vocab_size": 256, "width": 64, "tie_embeddings": True},
    "num_layers": 2,
    "layer": {"mixer": {"kind": "attn", "num_heads": 2}, "ffn": {"kind": "swiglu", "hidden_size": 128}},
}
OVERHEAD_PROXY = {"task": "s5", "task_params": {"seq_len": 16, "degree": 3}, "batch_size": 32}
TARGETS = {"ray": 1.25, "optuna": 1.10}


# ---------------------------------------------------------------- helpers


def _write_space(data: dict, folder: Path, name: str):
    import yaml

    from nas.space import load_space

    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_space(path)


def calibrate(steps_probe: int) -> float:
    """CPU seconds per optimizer step of the overhead trial at one thread (this process)."""
    import torch

    from nas.load import resolve, spec_from_dict
    from runners.train import TrainConfig, train

    torch.set_num_threads(1)
    arch = resolve(spec_from_dict(copy.deepcopy(OVERHEAD_BASE), "bench"), "bench")
    cfg = dict(OVERHEAD_PROXY, eval_every=10_000, progress=False)
    train(arch, TrainConfig(**cfg, steps=5))  # warm-up: first-call costs are not per step
    t = time.process_time()
    train(arch, TrainConfig(**cfg, steps=steps_probe))
    return (time.process_time() - t) / steps_probe


# ---------------------------------------------------------------- 1. overhead


def overhead(backend: str, trials: int, steps: int, concurrency: int, work: Path) -> dict:
    from runners.results.records import read_trials
    from runners.sweep.run import run_sweep

    data = {
        "name": f"bench_overhead_{backend}",
        "base": copy.deepcopy(OVERHEAD_BASE),
        # distinct proxy settings → distinct canonical specs: no duplicate, nothing infeasible
        "params": {"warmup": {"target": "proxy.warmup_steps", "low": 10, "high": 10 + trials - 1}},
        "objectives": [{"metric": "acc", "direction": "maximize"},
                       {"metric": "projection_flops", "direction": "minimize"}],
        "proxy": dict(OVERHEAD_PROXY, steps=steps, eval_every=max(1, steps // 4)),
        "search": {"sampler": "grid", "trials": trials, "concurrency": concurrency, "resources": {"cpu": 1}},
    }
    space = _write_space(data, work, f"overhead_{backend}")
    out = work / f"overhead_{backend}"
    t0 = time.perf_counter()
    run_sweep(space, out, engine=backend, progress=False)
    wall = time.perf_counter() - t0
    records = read_trials(out)
    done = [r for r in records if r.status == "complete"]
    times = [r.wall_time for r in done if r.wall_time is not None]
    ideal = sum(times) / concurrency
    starts = [r.started for r in done if r.started]
    ends = [r.finished for r in done if r.finished]
    return {
        "engine": backend, "trials": len(records), "complete": len(done), "concurrency": concurrency,
        "steps": steps, "sweep_wall_s": wall, "sum_trial_s": sum(times), "ideal_s": ideal,
        "ratio": wall / ideal if ideal else float("nan"),
        "mean_trial_s": sum(times) / len(times) if times else float("nan"),
        "first_start_to_last_end_s": (max(ends) - min(starts)) if starts and ends else float("nan"),
        "target": TARGETS.get(backend), "dir": str(out),
    }


# ---------------------------------------------------------------- 2. early stopping


def es_spaces(path: Path, work: Path, steps: int | None, rung_fracs: list[float], margin: float,
              min_beaten_by: int, quick: bool) -> tuple:
    import yaml

    from nas.space import grid_size, load_space

    original = load_space(path)  # checks the file; gives the resolved base
    data = yaml.safe_load(Path(original.source).read_text())
    data["base"] = copy.deepcopy(original.base)  # inline: the copy lives in another folder
    if quick:  # the first two values of the first two parameters, the first of the others
        for i, p in enumerate(data["params"].values()):
            keep = 2 if i < 2 else 1
            if "choices" in p:
                p["choices"] = p["choices"][:keep]
            elif isinstance(p.get("low"), int) and isinstance(p.get("high"), int):
                p["high"] = min(p["high"], p["low"] + (keep - 1) * (p.get("step") or 1))
    proxy = data["proxy"]
    if steps is not None:
        proxy["steps"] = steps
    total = proxy.get("steps")
    if not total:
        raise SystemExit("the ES space's proxy needs steps (not tokens or a curriculum only)")
    rungs = sorted({max(1, round(total * f)) for f in rung_fracs})
    every = math.gcd(*rungs, total)
    if every != proxy.get("eval_every") and any(r % proxy.get("eval_every", 50) for r in [*rungs, total]):
        proxy["eval_every"] = every
    search = data.setdefault("search", {})
    search.update(sampler="grid", sampler_params={})
    search.pop("early_stopping", None)
    name = data.get("name", "es")
    data["name"] = f"{name}_full"
    full = _write_space(data, work, "es_full")
    size = grid_size(full)
    if size is None:
        raise SystemExit(f"{path}: the ES benchmark needs a finite grid (choices or stepped ranges)")
    search["trials"] = size
    full = _write_space(data, work, "es_full")
    data["name"] = f"{name}_es"
    search["early_stopping"] = {"rungs": rungs, "margin": margin, "min_beaten_by": min_beaten_by}
    es = _write_space(data, work, "es_halving")
    return full, es, rungs, total


def _identity(r) -> str:
    return r.spec_hash or json.dumps(r.params, sort_keys=True)


def _compute(records, seq_len: int, total_steps: int) -> tuple[float, dict[str, float]]:
    from nas.space import cost_value
    from nas.spec import stored_spec

    per = {}
    for r in records:
        if r.arch is None or r.status in ("duplicate", "infeasible"):
            continue
        trained = total_steps if r.status == "complete" else max((g.step for g in r.rungs), default=0)
        per[_identity(r)] = cost_value(stored_spec(r.arch), "projection_flops", seq_len) * trained
    return sum(per.values()), per


def early_stopping(full_space, es_space, rungs: list[int], total: int, backend: str, work: Path) -> dict:
    from runners.results.front import front
    from runners.results.records import read_experiment, read_trials
    from runners.sweep.run import run_sweep

    out = {}
    for label, space in (("full", full_space), ("es", es_space)):
        t0 = time.perf_counter()
        run_sweep(space, work / f"es_{label}", engine=backend, progress=False)
        out[label] = {"dir": work / f"es_{label}", "wall": time.perf_counter() - t0}
    objectives = read_experiment(out["full"]["dir"]).objectives
    seq_len = full_space.spec.seq_len
    recs = {k: read_trials(v["dir"]) for k, v in out.items()}
    by_id = {k: {_identity(r): r for r in v} for k, v in recs.items()}
    compute = {k: _compute(v, seq_len, total) for k, v in recs.items()}
    ids = {k: {r.id: _identity(r) for r in v} for k, v in recs.items()}
    full_front = {ids["full"][p.trial] for p in front(recs["full"], objectives)}
    es_front_ids = {ids["es"][p.trial] for p in front(recs["es"], objectives)}
    kept = [i for i in full_front if by_id["es"].get(i) is not None and by_id["es"][i].status == "complete"]
    measured = next(o.name for o in objectives if o.measured)
    same = [i for i, r in by_id["es"].items() if r.status == "complete" and i in by_id["full"]
            and by_id["full"][i].status == "complete"
            and by_id["full"][i].values.get(measured) == r.values.get(measured)]
    n_es_complete = sum(r.status == "complete" for r in recs["es"])
    stopped_at = {}
    for r in recs["es"]:
        if r.status == "pruned":
            step = max((g.step for g in r.rungs), default=0)
            stopped_at[step] = stopped_at.get(step, 0) + 1
    wall = {k: sum(r.wall_time or 0.0 for r in v) for k, v in recs.items()}
    es_spec = es_space.spec.search.early_stopping
    return {
        "space": str(full_space.spec.name.removesuffix("_full")), "candidates": len(by_id["full"]),
        "steps": total, "rungs": rungs, "margin": es_spec.margin, "min_beaten_by": es_spec.min_beaten_by,
        "status_full": _counts(recs["full"]), "status_es": _counts(recs["es"]),
        "stopped_at_step": {str(k): v for k, v in sorted(stopped_at.items())},
        "compute_full": compute["full"][0], "compute_es": compute["es"][0],
        "saving": 1.0 - compute["es"][0] / compute["full"][0] if compute["full"][0] else float("nan"),
        "saving_trial_time": 1.0 - wall["es"] / wall["full"] if wall["full"] else float("nan"),
        "sweep_wall_full_s": out["full"]["wall"], "sweep_wall_es_s": out["es"]["wall"],
        "front_full": sorted(full_front), "front_es": sorted(es_front_ids),
        "recall": len(full_front & es_front_ids) / len(full_front) if full_front else float("nan"),
        "recall_kept": len(kept) / len(full_front) if full_front else float("nan"),
        "deterministic": f"{len(same)}/{n_es_complete}",
        "trials": [_trial_row(by_id["full"][i], by_id["es"].get(i), measured, i in full_front,
                              compute["full"][1].get(i, 0.0))
                   for i in sorted(by_id["full"], key=lambda i: compute["full"][1].get(i, 0.0))],
        "dirs": {k: str(v["dir"]) for k, v in out.items()},
    }


def _counts(records) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r.status] = out.get(r.status, 0) + 1
    return out


def _trial_row(full, es, measured: str, on_front: bool, compute: float) -> dict:
    return {"params": full.params, "summary": full.summary, "on_full_front": on_front,
            "compute_full": compute, "final": full.values.get(measured),
            "es_status": es.status if es else None,
            "es_stopped_at": (max((g.step for g in es.rungs), default=0)
                              if es is not None and es.status == "pruned" else None)}


def replay(exp_dir: Path, rungs: list[int], total: int, margins: list[float], min_beaten_by: int) -> list[dict]:
    """The halving rule replayed offline on the full-budget run's rung qualities, for several
    margins (no training: the rule sees the qualities it would have seen, trials arriving in
    trial order, each judged against the earlier ones still running at that rung). An
    estimate of the margin's effect; the live ES run is the measurement."""
    from runners.results.front import front
    from runners.results.records import read_experiment, read_trials
    from runners.sweep.stopping import ParetoHalving

    from nas.space import cost_value
    from nas.spec import stored_spec

    objectives = read_experiment(exp_dir).objectives
    seq_len = read_experiment(exp_dir).seq_len
    done = [r for r in read_trials(exp_dir) if r.status == "complete"]
    sign = {o.name: (1 if o.direction == "minimize" else -1) for o in objectives}
    measured = next(o for o in objectives if o.measured)
    flops = {r.id: cost_value(stored_spec(r.arch), "projection_flops", seq_len) for r in done}
    costs = {r.id: tuple(sign[o.name] * r.values[o.name] for o in objectives if not o.measured) for r in done}
    members = {p.trial for p in front(done, objectives)}
    full = sum(flops[r.id] * total for r in done)
    rows = []
    for margin in margins:
        rule, stopped = ParetoHalving(tuple(rungs), margin, min_beaten_by), {}
        for rung in rungs:
            for r in done:
                if r.id in stopped:
                    continue
                q = next((g.quality for g in r.rungs if g.step == rung), None)
                q = None if q is None else -sign[measured.name] * q
                if rule.decide(r.id, rung, costs[r.id], q):
                    stopped[r.id] = rung
        spent = sum(flops[r.id] * stopped.get(r.id, total) for r in done)
        kept = [r for r in done if r.id not in stopped]
        survivors = {p.trial for p in front(kept, objectives)}
        rows.append({"margin": margin, "saving": 1 - spent / full if full else float("nan"),
                     "recall": len(members & survivors) / len(members) if members else float("nan"),
                     "stopped": len(stopped)})
    return rows


# ---------------------------------------------------------------- 3. rank agreement


def rank_agreement(exp_dir: Path, es_rungs: list[int], total: int) -> list[dict]:
    from runners.results.records import read_experiment, read_trials

    measured = next(o.name for o in read_experiment(exp_dir).objectives if o.measured)
    done = [r for r in read_trials(exp_dir) if r.status == "complete" and measured in r.values]
    steps = sorted({g.step for r in done for g in r.rungs if g.step < total})
    rows = []
    for step in steps:
        pairs = [(g.quality, r.values[measured]) for r in done for g in r.rungs
                 if g.step == step and g.quality is not None]
        tau = kendall_tau([a for a, _ in pairs], [b for _, b in pairs]) if len(pairs) >= 2 else float("nan")
        rows.append({"step": step, "fraction": step / total, "n": len(pairs), "tau": tau,
                     "es_rung": step in es_rungs})
    return rows


# ---------------------------------------------------------------- report


def _fmt(x, spec=".3f") -> str:
    return "nan" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _label(params: dict) -> str:
    """``width=32 loop=block T=2`` (table-safe: no pipes)."""
    def one(v):
        if isinstance(v, dict):
            return " ".join(f"{k}={w}" if k != "boundary" else str(w) for k, w in v.items())
        return "none" if v is None else str(v)
    return " ".join(f"{k}={one(v)}" for k, v in params.items()).replace("|", "/")


def render(res: dict) -> str:
    lines = [f"# bench_sweep{' (quick)' if res['quick'] else ''}", "",
             "Command:", "", "```", res["command"], "```", "",
             f"Machine: {res['machine']}", ""]
    ov = res["overhead"]
    lines += ["## 1. Scheduling overhead", "",
              f"{ov['trials']} trials of one architecture at concurrency {ov['concurrency']}, one thread "
              f"each, {ov['steps']} steps (calibrated for ~{ov['trial_seconds']:g} s/trial idle: "
              f"{ov['cpu_s_per_step'] * 1e3:.1f} ms CPU/step).", "",
              "| backend | sweep wall s | sum trial s | ideal s | mean trial s | first start→last end s "
              "| ratio | target |",
              "|---|---|---|---|---|---|---|---|"]
    for r in ov["backends"]:
        lines.append(f"| {r['engine']} | {_fmt(r['sweep_wall_s'], '.1f')} | {_fmt(r['sum_trial_s'], '.1f')} | "
                     f"{_fmt(r['ideal_s'], '.1f')} | {_fmt(r['mean_trial_s'], '.1f')} | "
                     f"{_fmt(r['first_start_to_last_end_s'], '.1f')} | **{_fmt(r['ratio'], '.3f')}** | "
                     f"≤ {r['target']} |")
    es = res.get("early_stopping")
    if es is None:
        return "\n".join(lines) + "\n"
    lines += ["", "## 2. Early stopping (Pareto-aware halving)", "",
              f"Space `{es['space']}`: {es['candidates']} grid candidates, {es['steps']} steps, rungs at "
              f"{es['rungs']}, margin {es['margin']}, min_beaten_by {es['min_beaten_by']}, backend "
              f"{res['es_backend']}.", "",
              "| compute saved | front recall (on ES front) | front members not stopped | trial-time saved | "
              "full front size | stopped at step | deterministic finals |",
              "|---|---|---|---|---|---|---|",
              f"| **{_fmt(es['saving'] * 100, '.1f')} %** | **{_fmt(es['recall'] * 100, '.1f')} %** | "
              f"{_fmt(es['recall_kept'] * 100, '.1f')} % | {_fmt(es['saving_trial_time'] * 100, '.1f')} % | "
              f"{len(es['front_full'])} | {es['stopped_at_step'] or '-'} | {es['deterministic']} |", "",
              "| candidate | compute (full) | final quality | on full front | ES |", "|---|---|---|---|---|"]
    for t in es["trials"]:
        what = t["es_status"] + (f" @ {t['es_stopped_at']}" if t["es_stopped_at"] is not None else "")
        lines.append(f"| {_label(t['params'])} | {t['compute_full']:.3g} | {_fmt(t['final'])} | "
                     f"{'yes' if t['on_full_front'] else ''} | {what} |")
    lines += ["", "Margin trade-off, replayed offline on the full-budget run's rung qualities (same rule, "
              "same rungs, trials arriving in trial order; an estimate, no training):", "",
              "| margin | compute saved | front recall | stopped |", "|---|---|---|---|"]
    for r in es.get("replay", []):
        lines.append(f"| {r['margin']:g}{' (run above)' if r['margin'] == es['margin'] else ''} | "
                     f"{_fmt(r['saving'] * 100, '.1f')} % | {_fmt(r['recall'] * 100, '.1f')} % | {r['stopped']} |")
    lines += ["", "## 3. Rank agreement per rung (full-budget run)", "",
              "| step | fraction | trials | Kendall τ | ES rung |", "|---|---|---|---|---|"]
    for r in res["rank_agreement"]:
        lines.append(f"| {r['step']} | {r['fraction']:.3f} | {r['n']} | **{_fmt(r['tau'])}** | "
                     f"{'yes' if r['es_rung'] else ''} |")
    if res.get("notes"):
        lines += ["", "## Notes", "", *res["notes"]]
    return "\n".join(lines) + "\n"


def print_table(res: dict) -> None:
    print("\n1. Scheduling overhead (sweep wall / ideal)")
    for r in res["overhead"]["backends"]:
        print(f"   {r['engine']:7s} ratio {_fmt(r['ratio'])}  (target <= {r['target']})  wall "
              f"{_fmt(r['sweep_wall_s'], '.1f')} s, ideal {_fmt(r['ideal_s'], '.1f')} s, "
              f"mean trial {_fmt(r['mean_trial_s'], '.1f')} s")
    es = res.get("early_stopping")
    if es is None:
        return
    print("\n2. Early stopping")
    print(f"   compute saved {_fmt(es['saving'] * 100, '.1f')} %  front recall {_fmt(es['recall'] * 100, '.1f')} %"
          f"  (kept {_fmt(es['recall_kept'] * 100, '.1f')} %, front {len(es['front_full'])}, "
          f"stopped {es['stopped_at_step']}, margin {es['margin']})")
    print("   margin replay (offline): " + ", ".join(
        f"{r['margin']:g}: {_fmt(r['saving'] * 100, '.0f')} % saved / {_fmt(r['recall'] * 100, '.0f')} % recall"
        for r in es.get("replay", [])))
    print("\n3. Rank agreement per rung")
    for r in res["rank_agreement"]:
        print(f"   step {r['step']:5d} ({r['fraction']:.3f})  n={r['n']:2d}  tau {_fmt(r['tau'])}"
              f"{'  [ES rung]' if r['es_rung'] else ''}")


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small version (4 trials of ~3 s; ES grid: first 2 values of the "
                    "first 2 parameters, 40 steps)")
    ap.add_argument("--backends", default="optuna,ray", help="comma-separated: optuna,ray")
    ap.add_argument("--trials", type=int, default=None, help="overhead trials (default 8; quick 4)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--trial-seconds", type=float, default=None, help="target seconds per overhead "
                    "trial on an idle machine (default 20; quick 3)")
    ap.add_argument("--steps", type=int, default=None, help="overhead trial steps (skips calibration)")
    ap.add_argument("--es-space", default=str(ES_SPACE), help="space for sections 2 and 3")
    ap.add_argument("--es-steps", type=int, default=None, help="override the ES space's proxy steps")
    ap.add_argument("--es-backend", default="optuna")
    ap.add_argument("--rungs", default="0.25,0.5", help="ES rungs as fractions of the steps")
    ap.add_argument("--margin", type=float, default=0.02, help="ES margin (quality units)")
    ap.add_argument("--min-beaten-by", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: overhead,es")
    ap.add_argument("--results", default=None, help="folder for bench_sweep*.md/json (default benchmarks/results)")
    ap.add_argument("--work", default=None, help="folder for the experiment dirs (default: a temp dir)")
    ap.add_argument("--note", action="append", default=[], help="a line for the md file's notes")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=r".*is experimental")  # optuna's set_metric_names

    trials = args.trials or (4 if args.quick else 8)
    seconds = args.trial_seconds or (3.0 if args.quick else 20.0)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if "ray" in backends and "overhead" not in skip or args.es_backend == "ray":
        os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="bsray", dir="/tmp"))  # short: socket paths
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    results = Path(args.results) if args.results else RESULTS
    results.mkdir(parents=True, exist_ok=True)
    stem = "bench_sweep_quick" if args.quick else "bench_sweep"
    cmd = "python benchmarks/bench_sweep.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    t_start = time.time()
    load0 = os.getloadavg()[0]

    res: dict = {"quick": args.quick, "command": cmd.strip(), "work": str(work), "es_backend": args.es_backend,
                 "machine": f"{socket.gethostname()}, {os.cpu_count()} CPUs, load average at start "
                            f"{load0:.1f}", "notes": list(args.note)}
    ov = {"trials": trials, "concurrency": args.concurrency, "trial_seconds": seconds, "backends": []}
    if "overhead" not in skip:
        per_step = calibrate(10 if args.quick else 40)
        steps = args.steps or max(8, round(seconds / per_step))
        ov.update(cpu_s_per_step=per_step, steps=steps)
        for backend in backends:
            print(f"[overhead] {backend}: {trials} trials x {steps} steps ...", file=sys.stderr, flush=True)
            ov["backends"].append(overhead(backend, trials, steps, args.concurrency, work))
    else:
        ov.update(cpu_s_per_step=float("nan"), steps=0)
    res["overhead"] = ov

    if "es" not in skip:
        fracs = [float(f) for f in args.rungs.split(",")]
        es_steps = args.es_steps or (40 if args.quick else None)
        full, es, rungs, total = es_spaces(Path(args.es_space), work, es_steps, fracs, args.margin,
                                           args.min_beaten_by, args.quick)
        print(f"[early stopping] {full.spec.name}: full budget, then rungs {rungs} ...", file=sys.stderr, flush=True)
        res["early_stopping"] = early_stopping(full, es, rungs, total, args.es_backend, work)
        margins = sorted({0.0, 0.01, 0.02, 0.03, 0.05, args.margin})
        res["early_stopping"]["replay"] = replay(Path(res["early_stopping"]["dirs"]["full"]), rungs, total,
                                                 margins, args.min_beaten_by)
        res["rank_agreement"] = rank_agreement(Path(res["early_stopping"]["dirs"]["full"]), rungs, total)
    res["elapsed_s"] = time.time() - t_start
    load1 = os.getloadavg()[0]
    res["machine"] += f", at end {load1:.1f}"
    if max(load0, load1) > (os.cpu_count() or 1):
        res["notes"].append(f"- The machine was shared while this ran (load average {load0:.1f} at start, "
                            f"{load1:.1f} at end, on {os.cpu_count()} CPUs): absolute times are inflated "
                            "several-fold and noisy. The claims are the ratios (overhead), compute counts "
                            "(saving: steps x FLOPs, timing-free) and rankings.")

    print_table(res)
    (results / f"{stem}.md").write_text(render(res))
    (results / f"{stem}.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"\nwrote {results / (stem + '.md')} and .json  ({res['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
