"""Where a sweep's wall time goes: worker start, build, train steps, evaluation, records and
Optuna, idle; the quickstart by default (issue #21).

Runs ``spaces/quickstart.yaml`` on the local backend in this process (the driver here, its
workers spawned as ``loopnas sweep`` spawns them), then writes its report as the sweep
command does. Without ``--full`` the proxy trains ``--steps`` steps with ``--seeds`` seeds
per candidate (default 200 and 2, ~2 minutes on 2 cores); ``--full`` keeps the space's own
budget (400 steps, 5 seeds: the README's main command).

The split is of slot-seconds: concurrency × the sweep's wall time, one slot per worker.
Nothing is added to the sweep's code; the timestamps are those it already keeps:

- each replicate's ``started``/``finished`` (the trial in its worker, records.jsonl) and its
  trainer's ``result.json`` ``timings``: ``build`` (task, model, optimizer, eval batches),
  ``train steps``, ``evaluation`` (periodic and final), ``checkpoint``, ``rung reports`` (the
  trainer's callback: the worker waits for the driver's go/stop answer); ``trial, outside
  train()`` is the rest of the trial (the worker's first import of the trainer and builders,
  the job's validation, result.json);
- in this process, by wrapping, not editing: when each worker process was created and which
  jobs it was given (``runners.sweep.local._Worker``), and when the driver was busy in
  ``Sweep.next_job``/``on_outcome``/``on_rung`` (Optuna's ask and tell, the gate's pricing,
  records written).

A slot's time outside trials is ``driver start`` (sweep start to the worker's creation),
``worker start`` (creation to its first trial: spawn, ``import torch``), and the gaps after a
trial: ``records/Optuna`` while the driver was busy, ``idle`` otherwise (pipes, polling,
scheduling, and a slot with nothing left to run at the end). The report is timed apart.

``python benchmarks/bench_sweep_split.py [--steps 200] [--seeds 2] [--full] [--out FILE.md]``
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/spaces shadows the spaces package otherwise
QUICKSTART = ROOT / "spaces" / "quickstart.yaml"
TRIAL_PHASES = {"build": "build", "steps": "train steps", "eval": "evaluation", "checkpoint": "checkpoint",
                "callback": "rung reports"}
ORDER = ("driver start", "worker start", "build", "train steps", "evaluation", "checkpoint", "rung reports",
         "trial, outside train()", "records/Optuna", "idle")


class Probe:
    """Worker creation times, the jobs each worker was given, and the driver's busy intervals."""

    def __init__(self):
        self.created: dict[int, float] = {}
        self.given: dict[int, list[str]] = {}
        self.busy: list[tuple[float, float]] = []

    def install(self) -> None:
        from runners.sweep import local
        from runners.sweep.driver import Sweep

        probe = self
        init, give = local._Worker.__init__, local._Worker.give

        def created(worker, *args, **kw):
            init(worker, *args, **kw)
            probe.created[id(worker)] = time.time()

        def given(worker, job, *args, **kw):
            probe.given.setdefault(id(worker), []).append(job.dir)
            return give(worker, job, *args, **kw)

        local._Worker.__init__, local._Worker.give = created, given
        for name in ("next_job", "on_outcome", "on_rung"):
            setattr(Sweep, name, self._timed(getattr(Sweep, name)))

    def _timed(self, method):
        def timed(*args, **kw):
            start = time.time()
            try:
                return method(*args, **kw)
            finally:
                self.busy.append((start, time.time()))
        return timed

    def busy_within(self, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.busy)


def space_file(steps: int | None, seeds: int | None, work: Path) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    if steps is not None:
        data["proxy"]["steps"] = steps
        data["proxy"]["eval_every"] = min(data["proxy"].get("eval_every", 50), steps)
    if seeds is not None:
        data["proxy"]["seeds"] = seeds
    path = work / "quickstart.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def replicates(exp: Path) -> dict[str, dict]:
    """Each trained replicate by its job directory: started, finished, the trainer's result."""
    from runners.results.records import read_trials

    out = {}
    for record in read_trials(exp):
        reps = record.replicates or []
        for rep in reps:
            folder = exp / "trials" / record.id / (f"s{rep.index}" if len(reps) > 1 else "")
            result = folder / "result.json"
            if rep.started and rep.finished:
                out[str(folder).rstrip("/")] = {
                    "started": rep.started, "finished": rep.finished,
                    "result": json.loads(result.read_text()) if result.is_file() else {}}
    return out


def split(probe: Probe, reps: dict[str, dict], t0: float, t1: float, concurrency: int) -> dict[str, float]:
    """Slot-seconds per category (see the module docstring); they sum to concurrency × wall."""
    s = dict.fromkeys(ORDER, 0.0)

    def gap(a: float, b: float) -> None:
        driver = probe.busy_within(a, b)
        s["records/Optuna"] += driver
        s["idle"] += max(0.0, b - a - driver)

    workers = sorted(probe.created, key=probe.created.get)
    for w in workers:
        jobs = [reps[str(Path(d)).rstrip("/")] for d in probe.given.get(w, []) if str(Path(d)).rstrip("/") in reps]
        s["driver start"] += probe.created[w] - t0
        at = probe.created[w]
        for i, job in enumerate(jobs):
            if i == 0:
                s["worker start"] += job["started"] - at
            else:
                gap(at, job["started"])
            timings = job["result"].get("timings", {})
            for key, label in TRIAL_PHASES.items():
                s[label] += timings.get(key, 0.0)
            s["trial, outside train()"] += job["finished"] - job["started"] - sum(timings.values())
            at = job["finished"]
        gap(at, t1)
    s["idle"] += max(0, concurrency - len(workers)) * (t1 - t0)
    return s


def run(space_path: Path, work: Path) -> dict:
    from nas.space import load_space
    from runners.report import write_report
    from runners.sweep.run import run_sweep

    probe = Probe()
    probe.install()
    space = load_space(space_path)
    exp = work / "exp"
    cpu0, children0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    run_sweep(space, exp, engine="optuna", progress=False)
    t1 = time.time()
    write_report(exp)
    t2 = time.time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    concurrency = space.spec.search.concurrency
    reps = replicates(exp)
    return {"wall_s": t1 - t0, "report_s": t2 - t1, "concurrency": concurrency, "jobs": len(reps),
            "workers": len(probe.created), "driver_cpu_s": time.process_time() - cpu0,
            "workers_cpu_s": (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime),
            "split": split(probe, reps, t0, t1, concurrency), "proxy": space.spec.proxy.model_dump(
                include={"steps", "seeds", "eval_every", "eval_batches", "batch_size"})}


def table(res: dict) -> str:
    total = res["concurrency"] * res["wall_s"]
    lines = ["| where | slot-seconds | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.1f} | {100 * v / total:.1f}% |" for k, v in res["split"].items()]
    lines.append(f"| **sum** (= {res['concurrency']} slots × {res['wall_s']:.1f} s wall) | "
                 f"{sum(res['split'].values()):.1f} | {100 * sum(res['split'].values()) / total:.1f}% |")
    return "\n".join(lines)


def summary(res: dict) -> str:
    p = res["proxy"]
    return (f"{res['jobs']} trainings ({p['steps']} steps, {p['seeds']} seeds per candidate, eval every "
            f"{p['eval_every']} on {p['eval_batches']} batches) on {res['workers']} workers: sweep "
            f"{res['wall_s']:.1f} s wall, then the report {res['report_s']:.1f} s; CPU: driver "
            f"{res['driver_cpu_s']:.1f} s, workers {res['workers_cpu_s']:.1f} s.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="proxy steps (ignored with --full)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per candidate (ignored with --full)")
    parser.add_argument("--full", action="store_true", help="the quickstart's own budget")
    parser.add_argument("--work", help="folder for the experiment (default: a temporary one)")
    parser.add_argument("--out", help="also append the table, with its command and machine, to this .md file")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="sweep_split_"))
    work.mkdir(parents=True, exist_ok=True)
    path = space_file(None if args.full else args.steps, None if args.full else args.seeds, work)
    res = run(path, work)
    text = summary(res) + "\n\n" + table(res)
    print(text)
    (work / "split.json").write_text(json.dumps(res, indent=2))
    if args.out:
        from runners.bench.compare import provenance

        with open(args.out, "a", encoding="utf-8") as f:
            f.write(provenance(f"experiment in {work}") + text + "\n\n")


if __name__ == "__main__":
    main()
