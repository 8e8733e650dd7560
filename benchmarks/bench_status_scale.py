"""`loopnas status` and `loopnas report` on sweeps of 1,000 and 10,000 candidates × 5 seeds,
against Optuna's own plots of the same trials (issue #32).

The experiments are fabricated from real records: each candidate is a copy of one trial of
a real sweep (``--source``; by default the README's main command's records, ``runs/quickstart``, else a
tiny real sweep run here first: 2 candidates × 2 seeds, a few steps) with every metric
jittered by 5%: each replicate's quality and each candidate's projection compute (and its
cost sheet) multiplied by ``1 + 0.05 z``, z standard normal, independently; each trial's
point is the mean and standard error of its jittered replicates, as the driver writes it.

Timed in this process (a fresh in-process reader each time, so nothing is cached in
memory) and as subprocesses (`loopnas status --json`, `loopnas report`, `loopnas export --pick knee`: their wall time
and peak RSS). The baseline, timed in this same process: an in-memory Optuna study of the
same trials (``optuna.trial.create_trial`` with the replicate means as values) and
``optuna.visualization.plot_pareto_front`` + ``plot_hypervolume_history`` written as one
HTML page. The ratio is loopnas ÷ Optuna. Under the table, the report's peak RSS after each
of its stages, in one more fresh process (``STAGES``).

``python benchmarks/bench_status_scale.py [--sizes 1000,10000] [--seeds 5] [--source DIR] [--out FILE.md]``
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MAIN = ROOT / "runs" / "quickstart"  # the README main command's records (its --out), where they exist
JITTER = 0.05


def tiny_source(work: Path) -> Path:
    """A real sweep to copy from: 2 candidates × 2 seeds of a few steps (about a minute)."""
    from runners.sweep.run import run_sweep

    space = work / "space.yaml"
    space.write_text(textwrap.dedent("""\
        name: scale_source
        base: tiny_noloop
        params:
          boundary: {target: loop.boundary, choices: [none, block]}
          T: {target: loop.T, choices: [2], when: {boundary: [block]}}
        objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
        proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 8, batch_size: 4, eval_every: 4, seeds: 2}
        search: {sampler: grid, trials: 2, concurrency: 2}
        """))
    return run_sweep(space, work / "source", progress=False)


def _jitter_cost(cost: dict, factor: float) -> dict:
    cost = json.loads(json.dumps(cost))
    for figures in [cost, *cost.get("per_k", {}).values()]:
        if "projection_flops_per_token" in figures:
            figures["projection_flops_per_token"] = round(figures["projection_flops_per_token"] * factor)
    return cost


def _candidate(src: dict, number: int, seeds: int, rng: np.random.Generator, quality: str, cost_name: str) -> dict:
    """One fabricated trial record: ``src`` with its replicates' quality and its cost jittered."""
    rec = json.loads(json.dumps(src))
    rec["id"], rec["number"], rec["seed"] = f"t{number:04d}", number, 0
    rec["status"], rec["duplicate_of"] = "complete", None
    base = [r for r in src["replicates"] if r["status"] == "complete"]
    flops = src["points"][0]["values"][cost_name] * (1 + JITTER * rng.standard_normal())
    reps, values = [], []
    for i in range(seeds):
        rep = json.loads(json.dumps(base[i % len(base)]))
        q = rep["points"][0]["values"][quality] * (1 + JITTER * rng.standard_normal())
        rep.update(index=i, seed=i, status="complete")
        rep["points"] = [{"k": None, "values": {quality: q, cost_name: flops}, "se": {}, "n": 1}]
        reps.append(rep)
        values.append(q)
    mean = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(seeds)) if seeds > 1 else math.nan
    rec["replicates"] = reps
    rec["points"] = [{"k": None, "values": {quality: mean, cost_name: flops}, "se": {quality: se, cost_name: 0.0},
                      "n": seeds}]
    if rec.get("cost"):
        rec["cost"] = _jitter_cost(rec["cost"], flops / src["points"][0]["values"][cost_name])
    rec["finished"] = (src.get("finished") or 0.0) + number
    return rec


def fabricate(source: Path, out: Path, candidates: int, seeds: int = 5, seed: int = 0) -> Path:
    """An experiment directory of ``candidates`` × ``seeds`` complete trials copied from the
    complete trials of the real experiment ``source`` (see the module docstring)."""
    exp = json.loads((source / "experiment.json").read_text())
    quality = next(o["name"] for o in exp["objectives"] if o["measured"])
    cost_name = next(o["name"] for o in exp["objectives"] if not o["measured"])
    srcs = [json.loads(p.read_text()) for p in sorted((source / "trials").glob("t*.json"))]
    srcs = [s for s in srcs if s["status"] == "complete" and s["points"] and s["replicates"]]
    (out / "trials").mkdir(parents=True)
    exp.update(trials=candidates, seeds=seeds, name=f"{exp['name']}_x{candidates}")
    (out / "experiment.json").write_text(json.dumps(exp, indent=2))
    rng = np.random.default_rng(seed)
    for n in range(candidates):
        rec = _candidate(srcs[n % len(srcs)], n, seeds, rng, quality, cost_name)
        (out / "trials" / f"{rec['id']}.json").write_text(json.dumps(rec, indent=2))
    return out


def _subprocess(*argv: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one `loopnas` command in a fresh process."""
    cmd = [sys.executable, "-c", "import sys; from runners.cli import _entry; sys.argv[0] = 'loopnas'; _entry()", *argv]
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return wall, int(proc.stderr.strip().splitlines()[-1]) / 1024


# the report in a fresh process as `loopnas report` runs it (collector paused), its peak RSS
# (VmHWM) after each stage: where the memory goes
STAGES = r"""
import sys
from runners.nogc import paused_gc
import runners.report as R, runners.report.charts as C, runners.report.importance as I
def hwm():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) // 1024
marks = [("imports", hwm())]
def after(module, name, label):
    f = getattr(module, name)
    def marked(*a, **kw):
        out = f(*a, **kw)
        marks.append((label, hwm()))
        return out
    setattr(module, name, marked)
after(R, "load", "records read and ranked")
after(C, "hypervolume_figure", "PNGs and plotly figures")
after(I, "param_importance", "importance")
after(R, "front_table", "front table")
after(R, "write_csv", "page and front.csv")
with paused_gc():
    R.write_report(sys.argv[1])
print("; ".join(f"{label} {mb}" for label, mb in marks))
"""


def stages(exp_dir: Path) -> str:
    """The report's peak memory (MB) after each stage, in a fresh process (:data:`STAGES`)."""
    proc = subprocess.run([sys.executable, "-c", STAGES, str(exp_dir)], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return proc.stdout.strip().splitlines()[-1]


def optuna_baseline(exp_dir: Path, out: Path) -> float:
    """Seconds for Optuna's own plots of the same trials: an in-memory study of their means,
    plot_pareto_front + plot_hypervolume_history written as one HTML page."""
    import optuna
    from optuna.distributions import FloatDistribution

    from runners.results.records import read_experiment, read_index

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    exp = read_experiment(exp_dir)
    names = [o.name for o in exp.objectives]
    digests = [d for d in read_index(exp_dir) if d["status"] == "complete"]
    t = time.perf_counter()
    study = optuna.create_study(directions=[o.direction for o in exp.objectives])
    study.add_trials([optuna.trial.create_trial(params={"x": float(d["number"])},
                                                distributions={"x": FloatDistribution(0, len(digests) + 1)},
                                                values=[d["points"][0]["values"][n] for n in names])
                      for d in digests])
    pareto = optuna.visualization.plot_pareto_front(study, target_names=names)
    worst = [max(d["points"][0]["values"][n] for d in digests) * 1.1 if o.direction == "minimize" else 0.0
             for n, o in zip(names, exp.objectives)]
    history = optuna.visualization.plot_hypervolume_history(study, reference_point=worst)
    out.write_text(pareto.to_html(include_plotlyjs=True) + history.to_html(include_plotlyjs=False))
    return time.perf_counter() - t


def measure(exp_dir: Path) -> dict:
    """status and report, in process and as commands, cold (no index) and warm; Optuna's plots."""
    import resource

    from runners.cli.status import status_data
    from runners.report import write_report

    for name in ("index.json", "index.more.json"):
        (exp_dir / name).unlink(missing_ok=True)
    row: dict = {}
    row["status_cold_s"], row["status_cold_mb"] = _subprocess("status", str(exp_dir), "--json")
    row["status_s"], row["status_mb"] = _subprocess("status", str(exp_dir), "--json")
    row["report_cold_s"], row["report_cold_mb"] = _subprocess("report", str(exp_dir))
    row["report_s"], row["report_mb"] = _subprocess("report", str(exp_dir))
    row["export_s"], row["export_mb"] = _subprocess("export", str(exp_dir), "--pick", "knee",
                                                    "--out", str(exp_dir / "exported"))
    t = time.perf_counter()
    data = status_data(exp_dir)
    row["status_inproc_s"] = time.perf_counter() - t
    t = time.perf_counter()
    write_report(exp_dir)
    row["report_inproc_s"] = time.perf_counter() - t
    row["page_mb"] = (exp_dir / "report" / "index.html").stat().st_size / 1e6
    row["front"] = len(data["front"])
    row["optuna_s"] = optuna_baseline(exp_dir, exp_dir / "optuna.html")
    row["optuna_page_mb"] = (exp_dir / "optuna.html").stat().st_size / 1e6
    row["inproc_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row["stages"] = stages(exp_dir)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--source", type=Path, default=MAIN if (MAIN / "experiment.json").is_file() else None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = args.source or tiny_source(tmp)
        lines = [f"source: {source}", "",
                 "| candidates × seeds | front | status cold s (MB) | status s (MB) | report cold s (MB) "
                 "| report s (MB) | page MB | export --pick knee s (MB) | Optuna plots s (page MB) | status ÷ Optuna "
                 "| report ÷ Optuna |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        stage_lines: list[str] = []
        for n in map(int, args.sizes.split(",")):
            exp_dir = fabricate(source, tmp / f"x{n}", n, args.seeds)
            r = measure(exp_dir)
            lines.append(f"| {n:,} × {args.seeds} | {r['front']} | {r['status_cold_s']:.2f} ({r['status_cold_mb']:.0f}) "
                         f"| {r['status_s']:.2f} ({r['status_mb']:.0f}) | {r['report_cold_s']:.2f} "
                         f"({r['report_cold_mb']:.0f}) | {r['report_s']:.2f} ({r['report_mb']:.0f}) | {r['page_mb']:.2f} "
                         f"| {r['export_s']:.2f} ({r['export_mb']:.0f}) | {r['optuna_s']:.2f} ({r['optuna_page_mb']:.2f}) | {r['status_s'] / r['optuna_s']:.2f} "
                         f"| {r['report_s'] / r['optuna_s']:.2f} |")
            print(lines[-1], flush=True)
            stage_lines.append(f"- {n:,} × {args.seeds}, the report's peak MB after each stage: {r['stages']}")
            shutil.rmtree(exp_dir)
    text = "\n".join(lines + [""] + stage_lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
