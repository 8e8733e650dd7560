"""Control-plane cost of a sweep: loopnas' driver per trial, against bare Optuna and bare Ray
Tune, and the sampler's own cost as the study grows (issue #32).

    python benchmarks/bench_control_plane.py                        # the committed run (~37 min on 2 loaded cores)
    python benchmarks/bench_control_plane.py --quick                # 200 trials, ~3 min
    python benchmarks/bench_control_plane.py --out benchmarks/results/bench_control_plane.md

**No training.** Every trial is a no-op: the real trial wrapper runs in its real worker (a
spawned local worker process or a Ray actor: ``runners.sweep.trial.run_trial``, the Job
validation, the thread setting, the device placement), but its ``_train`` is replaced in the
worker by :func:`fake_train`, which reports ``--rungs`` rungs through the real report path
(pipe round-trip to the driver / ``tune.report``) and returns a complete outcome whose quality
is a deterministic function of the candidate. So the measured wall is everything but
training: the study's ask and tell, the gate (candidate lowering, budget match, pricing,
hash, duplicate check), the records, the journal, the progress line, scheduling and IPC.
Nothing in ``runners/`` is edited: the worker entry point and the Ray trainable are swapped
for wrappers in this process, as ``bench_sweep_split.py`` wraps the pool.

**The space** (:data:`SPACE`): the quickstart's (mixer x loop boundary, every candidate
budget-matched to 62,692 unique parameters by resizing its FFN) with one seed per candidate
and the proxy's learning rate as a continuous parameter, so that every candidate is a
distinct canonical spec (none is settled as a duplicate: each one reaches a worker).
Objectives: acc (from the no-op trial) and projection FLOPs (priced by the driver).

**Baselines, same trial count, same machine, same script, run one after the other:**

- *bare Optuna*: an ask/tell loop over one study with the same sampler
  (``make_sampler`` of the space), the same storage (a ``JournalFileBackend`` file, or the
  same SQLite ``RDBStorage``), the same parameters suggested and the same kind of values
  told (no intermediate values: Optuna's ``trial.report`` refuses a multi-objective study;
  loopnas keeps rungs in its records, not in the study);
- *bare Ray Tune*: ``tune.Tuner`` with a trivial function trainable (``--rungs`` + 1
  ``tune.report`` calls), the same parameters in ``param_space`` (Tune's default search),
  ``max_concurrent_trials`` 2, one CPU per trial, ``reuse_actors=True``, ``num_samples`` N.

**Per-trial overhead** is the steady-state interval between trial completions: (time of the
last completion - time of the first) / (N - 1), so the fixed start (worker spawn and
``import torch``, ``ray.init``) is left out; it is reported apart with the whole wall.
loopnas' driver time is split by wrapping (exclusive time, nested calls subtracted): the
sampler's methods, the journal's reads and appends, the records' writes, the gate's pricing
(``cost_value``, ``violations``, ``summary``, ``spec_hash``), ``Space.candidate`` (lowering
and budget match, the suggests' sampler time excluded), the rest of ``next_job``/``on_outcome``/
``on_rung`` (records bookkeeping, the study's own ask/tell code), the progress line; the rest
of the wall is the pool/Tune (pipes, worker round trips, Tune's event loop).

**Sampler growth**: the sampler's own time per trial (its ``infer_relative_search_space``,
``sample_relative``, ``sample_independent``, ``before_trial``, ``after_trial``) at study sizes
up to 10,000 (in memory: a journal study too holds its trials in memory, so the sampler's
time is the same; only the fill is faster). TPE (the space's default and Optuna 5's default for a
multi-objective study) at n >= ``--tpe-full`` is measured on a study filled to n by the
random sampler and then asked ``--probe`` trials by TPE (TPE's cost depends on how many
trials the study holds, not on who proposed them; the 2,000 point is checked against the
full TPE run's window); NSGA-II and random run whole.

Each configuration runs in its own child process (``--one``); the parent writes the table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

SPACE = {
    "name": "bench_control_plane",
    "base": {
        "name": "quickstart_base",
        "model": {"vocab_size": 256, "width": 64, "tie_embeddings": True,
                  "defaults": {"gdn": {"num_heads": 2, "head_dim": 32, "expand_v": 1},
                               "attn": {"num_heads": 2}, "swiglu": {"hidden_size": 128}}},
        "num_layers": 1,
        "layer": {"mixer": {"kind": "gdn"}, "ffn": {"kind": "swiglu"}},
    },
    "params": {
        "mixer": {"target": "layer.mixer.kind", "choices": ["gdn", "attn"]},
        "boundary": {"target": "loop.boundary", "choices": ["none", "block", "mixer"]},
        "T": {"target": "loop.T", "choices": [2], "when": {"boundary": ["block", "mixer"]}},
        "update": {"target": "loop.update", "choices": [{"kind": "residual_gate", "shared": True}],
                   "when": {"boundary": ["block", "mixer"]}},
        "lr": {"target": "proxy.lr", "low": 1e-3, "high": 1e-2, "log": True},
    },
    "match": {"unique_params": 62692, "vary": "ffn_hidden", "tolerance": 0.005},
    "objectives": [{"metric": "acc", "direction": "maximize"},
                   {"metric": "projection_flops", "direction": "minimize"}],
    "proxy": {"task": "hop_induction", "task_params": {"n": 32, "k": 3, "alphabet_size": 4},
              "steps": 400, "batch_size": 32, "lr": 0.003, "eval_every": 100, "eval_batches": 16, "seeds": 1},
    "search": {"sampler": "random", "trials": 100, "concurrency": 2, "seed": 0},
}
SAMPLER_METHODS = ("infer_relative_search_space", "sample_relative", "sample_independent", "before_trial",
                   "after_trial")
RUNGS = int(os.environ.get("BENCH_CP_RUNGS", "4"))  # read by the workers too (inherited environment)


# ---------------------------------------------------------------- the no-op trial


def quality(lr: float, arch: dict | None = None) -> float:
    """A deterministic acc in [0, 1] for a candidate (no training)."""
    mixer = ((arch or {}).get("layers") or [{}])[0].get("mixer", {}).get("kind", "")
    return 0.5 + 0.45 * math.sin(1e4 * lr + len(str(mixer)))


def fake_train(job, report, start, device):
    """``runners.sweep.trial._train`` without training: RUNGS rungs through the real report
    path, then a complete outcome."""
    from runners.results.records import Rung

    steps = int(job.config.get("steps") or 400)
    every = max(1, steps // RUNGS) if RUNGS else steps
    value = quality(float(job.config.get("lr", 0.003)), job.arch)
    rungs = []
    for step in range(every, every * RUNGS + 1, every) if RUNGS else ():
        rung = Rung(step=step, quality=value, metrics={"acc": value})
        rungs.append(rung.model_dump())
        if not report(rung):
            return {"status": "pruned", "reason": f"stopped early at step {step}", "rungs": rungs}
    return {"status": "complete", "reason": None, "rungs": rungs, "steps": steps, "tokens": 0,
            "measured": [{"k": None, "value": value, "metrics": {"acc": value}}]}


def bench_worker_main(conn, threads: int) -> None:
    """The local pool's worker (``runners.sweep.local._worker_main``) with the no-op trial."""
    import runners.sweep.trial as trial
    from runners.sweep.local import _worker_main

    trial._train = fake_train
    _worker_main(conn, threads)


def bench_ray_trainable(config):
    """``runners.sweep.trial.ray_trainable`` with the no-op trial (pickled by value)."""
    import runners.sweep.trial as trial

    trial._train = fake_train
    return trial.ray_trainable(config)


# ---------------------------------------------------------------- timing by wrapping


class Timer:
    """Exclusive time per category: a wrapped call's time less its wrapped callees'."""

    def __init__(self):
        self.excl: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.stack: list[list[float]] = []  # per open call: [child time]

    def wrap(self, fn, cat: str):
        timer = self

        def timed(*args, **kw):
            timer.stack.append([0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                dt = time.perf_counter() - t0
                child = timer.stack.pop()[0]
                timer.excl[cat] = timer.excl.get(cat, 0.0) + dt - child
                timer.calls[cat] = timer.calls.get(cat, 0) + 1
                if timer.stack:
                    timer.stack[-1][0] += dt

        timed.__wrapped__ = fn
        return timed

    def patch(self, owner, name: str, cat: str) -> None:
        setattr(owner, name, self.wrap(getattr(owner, name), cat))

    def sampler(self, sampler, cat: str = "sampler"):
        for name in SAMPLER_METHODS:
            setattr(sampler, name, self.wrap(getattr(sampler, name), cat))
        return sampler


def journal_timer(timer: Timer) -> None:
    from optuna.storages.journal import JournalFileBackend

    timer.patch(JournalFileBackend, "append_logs", "journal append")
    timer.patch(JournalFileBackend, "read_logs", "journal read")


# ---------------------------------------------------------------- the measurements (child process)


def space_file(work: Path, trials: int, sampler: str, storage: str | None) -> Path:
    import copy

    import yaml

    data = copy.deepcopy(SPACE)
    data["search"].update(trials=trials, sampler=sampler)
    if storage:
        data["search"]["storage"] = storage
    data["proxy"]["eval_every"] = max(1, data["proxy"]["steps"] // RUNGS) if RUNGS else data["proxy"]["steps"]
    path = work / "space.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_loopnas(engine: str, trials: int, sampler: str, storage: str | None, work: Path) -> dict:
    import nas.space
    from nas.space import load_space
    from runners.sweep import driver, gate, local, recorder, run, study
    from runners.sweep import trial as trial_mod
    from runners.results.records import read_trials

    timer = Timer()
    finished: list[float] = []
    journal_timer(timer)
    make = study.make_sampler
    study.make_sampler = lambda *a, **k: timer.sampler(make(*a, **k))
    for name in ("cost_value", "violations", "summary", "spec_hash"):
        setattr(gate, name, timer.wrap(getattr(gate, name), "pricing (cost model, hash)"))
    driver.cost_value = timer.wrap(driver.cost_value, "pricing (cost model, hash)")
    timer.patch(recorder, "write_json", "records (JSON writes)")
    timer.patch(nas.space.Space, "candidate", "candidate (lower, match)")
    timer.patch(driver.Sweep, "next_job", "next_job rest (ask, gate)")
    timer.patch(driver.Sweep, "on_rung", "on_rung rest")
    timer.patch(run._Line, "counts", "progress line")
    timer.patch(run._Line, "text", "progress line")
    on_outcome = timer.wrap(driver.Sweep.on_outcome, "on_outcome rest (tell, record)")

    def on_outcome_stamped(self, *a, **k):
        out = on_outcome(self, *a, **k)
        finished.append(time.perf_counter())
        return out

    driver.Sweep.on_outcome = on_outcome_stamped
    local._worker_main = bench_worker_main
    trial_mod.ray_trainable = bench_ray_trainable
    if storage == "sqlite":
        storage = f"sqlite:///{work / 'study.db'}"
    space = load_space(space_file(work, trials, sampler, storage))
    out = work / "exp"
    cpu0 = time.process_time()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run.run_sweep(space, out, engine=engine, progress=True)
    wall = time.perf_counter() - t0
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    records = read_trials(out)
    complete = sum(r.status == "complete" for r in records)
    return {"wall_s": wall, "driver_cpu_s": time.process_time() - cpu0,
            "children_cpu_s": (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime),
            "trials": len(records), "complete": complete, "finished": finished, "t0": t0,
            "split": timer.excl, "calls": timer.calls}


def bare_params(trial) -> tuple[float, float]:
    """The space's parameters, suggested directly, and trivial values."""
    mixer = trial.suggest_categorical("mixer", ["gdn", "attn"])
    boundary = trial.suggest_categorical("boundary", ["none", "block", "mixer"])
    if boundary != "none":
        trial.suggest_categorical("T", [2])
        trial.suggest_categorical("update", ["{kind: residual_gate, shared: true}"])
    lr = trial.suggest_float("lr", 1e-3, 1e-2, log=True)
    flops = (1.0 if mixer == "gdn" else 1.2) * (1 if boundary == "none" else 2) * 1e6
    return quality(lr, {"layers": [{"mixer": {"kind": mixer}}]}), flops


def bare_optuna(trials: int, sampler: str, storage: str | None, work: Path, fill: str | None = None,
                probes: list[int] | None = None, probe: int = 20) -> dict:
    """The ask/tell loop. With ``fill``/``probes``: the study is filled by ``fill`` (a sampler
    name) and, at each size in ``probes``, ``probe`` trials are asked by ``sampler``."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from nas.space import load_space
    from runners.sweep.study import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(space_file(work, trials, sampler, None))
    timer = Timer()
    journal_timer(timer)
    if storage == "sqlite":
        store = optuna.storages.RDBStorage(f"sqlite:///{work / 'study.db'}")
    elif storage == "memory":
        store = optuna.storages.InMemoryStorage()
    else:
        store = JournalStorage(JournalFileBackend(str(work / "journal.log")))
    main = timer.sampler(make_sampler(space, trials))
    filler = None
    if fill:
        filler = timer.sampler(make_sampler(load_space(space_file(work, trials, fill, None)), trials), "filler")
    study = optuna.create_study(storage=store, sampler=filler or main, study_name="bare",
                                directions=["maximize", "minimize"])
    per_trial: list[tuple[int, float, float]] = []  # (n before, sampler s, ask..tell s)
    finished: list[float] = []
    todo = sorted(probes or [])

    def one(s) -> None:
        before = timer.excl.get("sampler", 0.0)
        t = time.perf_counter()
        trial = study.ask()
        acc, flops = bare_params(trial)
        study.tell(trial, [acc, flops])
        now = time.perf_counter()
        if s is main:
            per_trial.append((trial.number, timer.excl.get("sampler", 0.0) - before, now - t))
        finished.append(now)

    cpu0, t0 = time.process_time(), time.perf_counter()
    n = 0
    while n < trials:
        if todo and n >= todo[0]:
            study.sampler = main
            for _ in range(probe):
                one(main)
            study.sampler = filler
            todo.pop(0)
            n += probe
            continue
        one(filler or main)
        n += 1
    return {"wall_s": time.perf_counter() - t0, "driver_cpu_s": time.process_time() - cpu0, "trials": n,
            "finished": [] if fill else finished, "t0": t0, "split": timer.excl, "calls": timer.calls,
            "per_trial": per_trial}


def bare_ray(trials: int, work: Path) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    import logging

    import ray
    from ray import tune

    finished: list[float] = []

    class Stamp(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            finished.append(time.perf_counter())

    def trainable(config):
        acc = 0.5 + 0.45 * math.sin(1e4 * config["lr"])
        for step in range(1, RUNGS + 1):
            tune.report({"acc": acc, "step": step})
        tune.report({"acc": acc, "done": True})

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
             configure_logging=False)
    t1 = time.perf_counter()
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"mixer": tune.choice(["gdn", "attn"]), "boundary": tune.choice(["none", "block", "mixer"]),
                     "lr": tune.loguniform(1e-3, 1e-2)},
        tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=2, reuse_actors=True),
        run_config=tune.RunConfig(name="bare", storage_path=str(work / "ray"), verbose=0, callbacks=[Stamp()]))
    cpu0 = time.process_time()
    grid = tuner.fit()
    done = sum(1 for r in grid if r.error is None)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    ray.shutdown()
    return {"wall_s": wall, "init_s": t1 - t0, "driver_cpu_s": cpu, "trials": len(grid), "complete": done,
            "finished": finished, "t0": t0, "split": {}, "calls": {}}


def one(cfg: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"cp_{cfg['kind']}_", dir=cfg.get("work")))
    kind, n = cfg["kind"], cfg["trials"]
    if kind == "loopnas":
        res = run_loopnas(cfg["engine"], n, cfg["sampler"], cfg.get("storage"), work)
    elif kind == "optuna":
        res = bare_optuna(n, cfg["sampler"], cfg.get("storage"), work, cfg.get("fill"), cfg.get("probes"),
                          cfg.get("probe", 20))
    elif kind == "ray":
        res = bare_ray(n, work)
    else:
        raise SystemExit(f"unknown kind {kind}")
    fin = res.pop("finished")
    t0 = res.pop("t0")
    if len(fin) > 1:
        res["steady_ms"] = 1e3 * (fin[-1] - fin[0]) / (len(fin) - 1)
        res["start_s"] = fin[0] - t0
        # steady interval per window of the run (growth with the study's size)
        w = max(1, len(fin) // 10)
        res["windows"] = [(i + w, 1e3 * (fin[min(i + w, len(fin) - 1)] - fin[i]) / max(1, min(i + w, len(fin) - 1) - i))
                          for i in range(0, len(fin) - 1, w)]
    res["load"] = os.getloadavg()[0]
    res["cfg"] = cfg
    res["work"] = str(work)
    return res


# ---------------------------------------------------------------- the parent: plan, run, table


def child(cfg: dict, timeout: float, log: Path) -> dict | None:
    cmd = [sys.executable, __file__, "--one", json.dumps(cfg)]
    env = dict(os.environ, BENCH_CP_RUNGS=str(RUNGS), PYTHONUNBUFFERED="1")
    print(f"-> {cfg}", flush=True)
    t = time.perf_counter()
    with open(log, "a") as err:
        err.write(f"\n==== {cfg}\n")
        err.flush()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, env=env,
                               cwd=ROOT)
        except subprocess.TimeoutExpired:
            print(f"   timed out after {timeout:.0f} s", flush=True)
            return {"cfg": cfg, "timeout": timeout}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        print(f"   failed (rc {p.returncode}); see {log}", flush=True)
        return {"cfg": cfg, "failed": p.returncode}
    res = json.loads(lines[-1])
    print(f"   {time.perf_counter() - t:.0f} s: steady {res.get('steady_ms', float('nan')):.2f} ms/trial, "
          f"wall {res['wall_s']:.1f} s, load {res['load']:.1f}", flush=True)
    return res


def plan(args) -> list[dict]:
    out = []
    for n in args.trials:
        if "optuna" in args.engines:
            out += [{"kind": "optuna", "trials": n, "sampler": "random"},
                    {"kind": "loopnas", "engine": "optuna", "trials": n, "sampler": "random"}]
        if "ray" in args.engines and n <= args.ray_max:
            out += [{"kind": "ray", "trials": n},
                    {"kind": "loopnas", "engine": "ray", "trials": n, "sampler": "random"}]
    small = min(args.trials)
    if "optuna" in args.engines:
        out += [{"kind": "optuna", "trials": min(small, args.tpe_full), "sampler": "tpe"},
                {"kind": "loopnas", "engine": "optuna", "trials": min(small, args.tpe_full), "sampler": "tpe"}]
        if args.sqlite:
            out += [{"kind": "optuna", "trials": args.sqlite, "sampler": "random", "storage": "sqlite"},
                    {"kind": "loopnas", "engine": "optuna", "trials": args.sqlite, "sampler": "random"},
                    {"kind": "loopnas", "engine": "optuna", "trials": args.sqlite, "sampler": "random",
                     "storage": "sqlite"}]
    big = max(args.trials)
    probes = [p for p in (500, 1000, 2000, 5000, 10000) if p < big] + [big]
    out += [{"kind": "optuna", "trials": big + args.probe * len(probes), "sampler": "tpe", "fill": "random",
             "probes": probes, "probe": args.probe, "storage": "memory"},
            {"kind": "optuna", "trials": big, "sampler": "nsga2", "storage": "memory"}]
    return out


def fmt(x, spec=".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def growth(res: dict, sizes: list[int]) -> dict[int, float]:
    """Sampler ms per trial near each study size (mean of the trials asked within 5% below it,
    or the probe trials at that size)."""
    pts = res.get("per_trial") or []
    out = {}
    for n in sizes:
        near = [s for k, s, _ in pts if n - max(20, n // 20) <= k < n + max(20, n // 20) and k >= 1]
        if near:
            out[n] = 1e3 * statistics.mean(near)
    return out


def report(results: list[dict], args, cmd: str, wall: float) -> str:
    from runners.bench.compare import provenance

    ok = [r for r in results if "wall_s" in r]

    def find(**want):
        for r in ok:
            if all(r["cfg"].get(k) == v for k, v in want.items()):
                return r
        return None

    lines = ["# bench_control_plane: the sweep driver's cost per trial, without training (issue #32)", "",
             provenance(f"whole script {wall / 60:.0f} min").rstrip(), ""]
    lines += [args.note, ""] if args.note else []
    lines += ["## Per-trial overhead, no-op trials", "",
              "Steady-state ms between trial completions (start-up left out: it is the next table); "
              "ratio = loopnas / the bare framework at the same N, same sampler (random), run one after the "
              "other in this script. Load = 1-min load average at the run's end (2 cores; another "
              "experiment was running).", "",
              "| engine | N | bare ms/trial | loopnas ms/trial | ratio | loopnas wall s (start s) | bare wall s | load |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for engine, bare in (("optuna", "optuna"), ("ray", "ray")):
        for n in args.trials:
            b = find(kind=bare, trials=n, sampler="random", storage=None, fill=None) if bare == "optuna" else find(kind="ray", trials=n)
            lo = find(kind="loopnas", engine=engine, trials=n, sampler="random", storage=None) or \
                find(kind="loopnas", engine=engine, trials=n, sampler="random")
            if b is None and lo is None:
                lines.append(f"| {engine} | {n:,} | not run | not run | — | — | — | — |")
                continue
            bs, ls = (b or {}).get("steady_ms"), (lo or {}).get("steady_ms")
            lines.append(f"| {engine} | {n:,} | {fmt(bs)} | {fmt(ls)} | {fmt(ls / bs if bs and ls else None)} | "
                         f"{fmt((lo or {}).get('wall_s'), '.1f')} ({fmt((lo or {}).get('start_s'), '.1f')}) | "
                         f"{fmt((b or {}).get('wall_s'), '.1f')} | {fmt((lo or b)['load'], '.1f')} |")
    lines.append("")
    # split
    split_rows = [r for r in ok if r["cfg"]["kind"] == "loopnas"]
    if split_rows:
        cats = ["sampler", "journal append", "journal read", "candidate (lower, match)", "pricing (cost model, hash)",
                "records (JSON writes)", "next_job rest (ask, gate)", "on_outcome rest (tell, record)", "on_rung rest",
                "progress line"]
        heads = [f"{r['cfg']['engine']} {r['cfg']['sampler']}{' sqlite' if r['cfg'].get('storage') else ''} "
                 f"{r['cfg']['trials']:,}" for r in split_rows]
        lines += ["## Where loopnas' per-trial time goes", "",
                  "Driver time by wrapping (exclusive ms per trial, whole run / N); *rest of the wall* is the "
                  "pool or Tune: pipes, worker round trips, Tune's event loop, and the start.", "",
                  "| ms / trial | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
        for c in cats:
            lines.append(f"| {c} | " + " | ".join(fmt(1e3 * r["split"].get(c, 0.0) / r["trials"]) for r in split_rows) + " |")
        lines.append("| **driver, wrapped** | " + " | ".join(
            fmt(1e3 * sum(r["split"].values()) / r["trials"]) for r in split_rows) + " |")
        lines.append("| rest of the wall | " + " | ".join(
            fmt(1e3 * (r["wall_s"] - sum(r["split"].values())) / r["trials"]) for r in split_rows) + " |")
        lines.append("| wall / N | " + " | ".join(fmt(1e3 * r["wall_s"] / r["trials"]) for r in split_rows) + " |")
        lines.append("| driver CPU / N | " + " | ".join(fmt(1e3 * r["driver_cpu_s"] / r["trials"]) for r in split_rows) + " |")
        lines.append("")
    # growth within runs
    lines += ["## Growth along a run", "",
              "Steady ms/trial in each tenth of the run (first → last tenth).", ""]
    for r in ok:
        if r.get("windows") and r["cfg"]["trials"] >= max(args.trials):
            c = r["cfg"]
            name = f"{'loopnas ' + c['engine'] if c['kind'] == 'loopnas' else 'bare ' + c['kind']} {c.get('sampler', '')}"
            lines.append(f"- {name} N={c['trials']:,}: " + ", ".join(fmt(v, ".1f") for _, v in r["windows"]))
    lines.append("")
    # TPE / storage comparisons
    lines += ["## Other samplers and storages", "", "| run | N | ms/trial (steady) | wall s | load |", "|---|---:|---:|---:|---:|"]
    for r in ok:
        c = r["cfg"]
        if c.get("fill") or (c.get("sampler") == "random" and not c.get("storage") and c["kind"] != "ray"
                             and c["trials"] in args.trials and not (args.sqlite and c["trials"] == args.sqlite)):
            continue
        if c["kind"] == "ray":
            continue
        name = f"{'loopnas ' + c['engine'] if c['kind'] == 'loopnas' else 'bare optuna'} {c['sampler']}" + \
            (f" {c['storage']}" if c.get("storage") else " journal")
        lines.append(f"| {name} | {c['trials']:,} | {fmt(r.get('steady_ms'))} | {fmt(r['wall_s'], '.1f')} | {fmt(r['load'], '.1f')} |")
    lines.append("")
    # sampler growth
    sizes = sorted({*(p for r in ok for p in (r["cfg"].get("probes") or [])), 100, 500, 1000, 2000, 5000, 10000})
    rows = []
    for label, want in (("TPE (full run, journal)", dict(kind="optuna", sampler="tpe", fill=None)),
                        ("TPE (probes on a random-filled study)", dict(kind="optuna", sampler="tpe", fill="random")),
                        ("NSGA-II (full run)", dict(kind="optuna", sampler="nsga2")),
                        ("random (full run)", dict(kind="optuna", sampler="random", storage=None))):
        cands = [r for r in ok if all(r["cfg"].get(k) == v for k, v in want.items())]
        if not cands:
            continue
        r = max(cands, key=lambda r: r["trials"])
        g = growth(r, sizes)
        rows.append(f"| {label} | " + " | ".join(fmt(g.get(n)) for n in sizes) + " |")
    lines += ["## The sampler's own time per trial as the study grows", "",
              "ms per trial in the sampler's methods (2 objectives, the space's 5 parameters; the TPE probes and "
              "NSGA-II on an in-memory study: the sampler reads the trials from memory either way), "
              "near each study size.", "",
              "| sampler | " + " | ".join(f"n={n:,}" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)] + rows
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    global RUNGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--trials", type=int, nargs="+", default=[2000, 10000])
    ap.add_argument("--engines", nargs="+", default=["optuna", "ray"])
    ap.add_argument("--ray-max", type=int, default=2000, help="largest N run on Ray (10,000 takes too long here)")
    ap.add_argument("--tpe-full", type=int, default=2000, help="N of the full TPE runs (loopnas and bare)")
    ap.add_argument("--sqlite", type=int, default=1000, help="N of the SQLite runs (0: none)")
    ap.add_argument("--probe", type=int, default=20, help="TPE trials asked at each probed study size")
    ap.add_argument("--rungs", type=int, default=RUNGS, help="rungs each no-op trial reports")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per configuration")
    ap.add_argument("--quick", action="store_true", help="200 trials, no SQLite, NSGA-II/TPE probes to 200")
    ap.add_argument("--out", help="write the markdown here")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--note", default="", help="a line for the results' header (e.g. the commit measured)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))), flush=True)
        return
    RUNGS = args.rungs
    if args.quick:
        args.trials, args.sqlite, args.tpe_full, args.ray_max = [200], 0, 200, 200
    log = Path(tempfile.mkdtemp(prefix="bench_cp_")) / "stderr.log"
    print(f"children's stderr: {log}", flush=True)
    t0 = time.perf_counter()
    results = [child(cfg, args.timeout, log) for cfg in plan(args)]
    wall = time.perf_counter() - t0
    cmd = "python benchmarks/bench_control_plane.py " + " ".join(a for a in sys.argv[1:])
    text = report(results, args, cmd.strip(), wall)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
