"""Sweeps of 10,000 candidates (issue #32): p_front resamples only the candidates that can
reach the front and equals today's bootstrap; status on a fabricated 10,000-candidate
experiment equals the small-sweep logic (runners.results.front.front) on the same records;
the sweep's progress line never runs the bootstrap."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from nas.noise import p_front, paired_seeds
from nas.pareto import pareto_front
from helpers import REPO

ROOT = REPO


def reference_p_front(replicates, directions, draws=1000, seed=0, seeds=None):
    """p_front before issue #32: every candidate resampled, the front of every draw by
    nas.pareto.pareto_front (O(n²) per draw)."""
    reps = [np.atleast_2d(np.asarray(r, dtype=float)) for r in replicates]
    rng = np.random.default_rng(seed)
    multi = [i for i, r in enumerate(reps) if len(r) > 1]
    order = paired_seeds(*[seeds[i] for i in multi]) if seeds is not None and multi else None
    if order is not None:
        for i in multi:
            at = {s: j for j, s in enumerate(seeds[i])}
            reps[i] = reps[i][[at[s] for s in order]]
    hits = np.zeros(len(reps))
    for _ in range(draws):
        shared = rng.integers(0, len(order), len(order)) if order is not None else None
        means = np.stack([r.mean(axis=0) if len(r) == 1 else
                          r[shared if shared is not None else rng.integers(0, len(r), len(r))].mean(axis=0)
                          for r in reps])
        hits[pareto_front(means, directions)] += 1
    return hits / draws


def _case(rng):
    n, s, m = int(rng.integers(1, 40)), int(rng.integers(2, 6)), int(rng.integers(1, 4))
    base = rng.normal(size=(n, 1, m)) * rng.uniform(0.1, 3)
    noise = rng.normal(size=(n, s, m)) * rng.uniform(0.01, 1)
    if rng.random() < 0.3:
        noise[:, :, -1] = 0  # a cost objective, known exactly
    if rng.random() < 0.3:  # ties everywhere
        base, noise = np.round(base, 1), np.round(noise, 1)
    reps = list(base + noise)
    if rng.random() < 0.3:
        reps[0] = reps[0][:1]  # one replicate: fixed
    if n > 1 and rng.random() < 0.2:
        reps[1] = reps[0].copy()  # a duplicate
    directions = [("minimize", "maximize")[int(rng.integers(0, 2))] for _ in range(m)]
    return reps, directions, s


@pytest.mark.parametrize("case", range(60))
def test_pruned_paired_p_front_equals_the_full_bootstrap_draw_for_draw(case):
    rng = np.random.default_rng(case)
    reps, directions, _ = _case(rng)
    seeds = [list(rng.permutation(len(r))) if len(r) > 1 else [0] for r in reps]
    got = p_front(reps, directions, draws=200, seed=case, seeds=seeds)
    assert np.array_equal(got, reference_p_front(reps, directions, draws=200, seed=case, seeds=seeds))


@pytest.mark.parametrize("case", range(8))
def test_unpaired_p_front_agrees_with_the_full_bootstrap_within_monte_carlo_error(case):
    rng = np.random.default_rng(1000 + case)
    reps, directions, _ = _case(rng)
    got = p_front(reps, directions, draws=1000, seed=case)
    want = reference_p_front(reps, directions, draws=1000, seed=case)
    se = np.sqrt(np.maximum(want * (1 - want), 1e-4) / 1000)
    assert np.all(np.abs(got - want) <= 5 * np.sqrt(2) * se + 1e-9), (got, want)
    assert np.array_equal(got == 0, want == 0) or np.all(got[want == 0] < 0.01)


def test_pruned_candidates_are_zero_and_the_rest_are_resampled():
    rng = np.random.default_rng(0)
    good = [np.column_stack([0.9 + 0.01 * rng.normal(size=5), np.full(5, 1.0)])]
    bad = [np.column_stack([0.5 + 0.01 * rng.normal(size=5), np.full(5, 2.0)]) for _ in range(200)]
    p = p_front(good + bad, ["maximize", "minimize"], seeds=[list(range(5))] * 201)
    assert p[0] == 1.0 and not p[1:].any()




def _bench():
    spec = importlib.util.spec_from_file_location("bench_status_scale", ROOT / "benchmarks" / "bench_status_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source(root: Path) -> Path:
    """Three small complete records of two objectives and 5 seeds, as a sweep writes them."""
    from runners.results.records import ExperimentRecord, Objective, Point, Replicate, TrialRecord, write_json

    objectives = [Objective(name="acc", direction="maximize", measured=True),
                  Objective(name="projection_flops", direction="minimize", measured=False)]
    (root / "trials").mkdir(parents=True)
    write_json(root / "experiment.json", ExperimentRecord(name="src", space={}, objectives=objectives,
                                                          engine="optuna", trials=3, seeds=5, created=0.0,
                                                          seq_len=64))
    rng = np.random.default_rng(7)
    for n, (acc, flops) in enumerate([(0.76, 1.25e5), (0.92, 1.68e5), (0.34, 1.1e5)]):
        accs = acc + 0.03 * rng.normal(size=5)
        reps = [Replicate(index=i, seed=i, status="complete",
                          points=[Point(values={"acc": float(a), "projection_flops": flops})]) for i, a in enumerate(accs)]
        write_json(root / "trials" / f"t{n:04d}.json", TrialRecord(
            id=f"t{n:04d}", number=n, status="complete", summary=f"candidate {n}", replicates=reps, params={"n": n},
            cost={"unique_params": 60_000, "projection_flops_per_token": flops, "forward_flops_per_token": flops,
                  "kv_cache_bytes": 1024 * n, "state_bytes": 512},
            points=[Point(values={"acc": float(accs.mean()), "projection_flops": flops}, n=5)]))
    return root


@pytest.mark.slow
def test_status_of_10000_candidates_equals_the_small_sweep_front(tmp_path):
    from runners.cli.status import status_data
    from runners.results.front import front
    from runners.results.records import INDEX, read_experiment, read_trials

    exp_dir = _bench().fabricate(_source(tmp_path / "src"), tmp_path / "exp", 10_000)
    data = status_data(exp_dir)
    assert (exp_dir / INDEX).is_file() and data["complete"] == 10_000
    small = front(read_trials(exp_dir), read_experiment(exp_dir).objectives)  # every record, the small-sweep logic
    assert [(p["trial"], p["values"], p["p_front"], p["tied"]) for p in data["front"]] == \
        [(p.trial, p.values, p.p_front, p.tied) for p in small]
    assert any(0 < p["p_front"] < 1 for p in data["front"])  # noise matters on this front
    # a record rewritten: the index notices (a new inode), and status follows it
    best = max(small, key=lambda p: p.values["acc"]).trial
    path = exp_dir / "trials" / f"{best}.json"
    record = json.loads(path.read_text())
    record["status"] = "failed"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)
    again = status_data(exp_dir)
    assert again["failed"] == 1 and best not in [p["trial"] for p in again["front"]]


def test_the_report_from_digests_ranks_as_from_whole_records(tmp_path, monkeypatch):
    import runners.report.data as data
    from nas.pareto import pareto_front as every_pair

    exp_dir = _bench().fabricate(_source(tmp_path / "src"), tmp_path / "exp", 300)
    whole = data.load(exp_dir)
    monkeypatch.setattr(data, "WHOLE", 0)
    digests = data.load(exp_dir)
    assert len(whole.rows) == 300 and len(whole.front) > 3
    assert digests.front == whole.front and sorted(whole.front) == every_pair(whole.matrix(), whole.directions).tolist()
    assert [(r.label, r.values, r.p_front, r.tied) for r in digests.rows] == \
        [(r.label, r.values, r.p_front, r.tied) for r in whole.rows]
    assert digests.knee == whole.knee and digests.noise == whole.noise
    assert data.hypervolume_history(digests) == data.hypervolume_history(whole)
    for axis in ("compute", "params", "memory"):
        values = [[r.values["acc"], r.get(axis)] for r in whole.rows]
        assert data.front_2d(digests, axis) == sorted(every_pair(values, ["maximize", "minimize"]).tolist(),
                                                      key=lambda i: (whole.rows[i].get(axis), whole.rows[i].label))


def test_the_benchmarks_stage_breakdown_runs_every_stage_of_the_report(tmp_path):
    """bench_status_scale's per-stage peak memory (its STAGES script) runs the real report in
    a fresh process and marks each stage once, in order, with a non-decreasing peak."""
    bench = _bench()
    exp_dir = bench.fabricate(_source(tmp_path / "src"), tmp_path / "exp", 30)
    marks = [m.rsplit(" ", 1) for m in bench.stages(exp_dir).split("; ")]
    assert [label for label, _ in marks] == ["imports", "records read and ranked", "PNGs and plotly figures",
                                             "importance", "front table", "page and front.csv"]
    peaks = [int(mb) for _, mb in marks]
    assert peaks == sorted(peaks) and peaks[0] > 0
    assert (exp_dir / "report" / "index.html").is_file()


def test_status_starts_without_the_cost_model_graphs_or_scipy_stats(tmp_path):
    """`loopnas status` at start-up: what it does not need (networkx, scipy.stats, the cost
    model, matplotlib, plotly, optuna, torch) it does not import; its front's ties come from
    nas.noise.t_sf (tested against scipy in test_noise.py)."""
    import subprocess
    import sys

    from runners.cli.status import ONESHOT_SUMMARY, TRANSFER_DIR
    from runners.report.oneshot import SUMMARY
    from runners.transfer import TRANSFER

    assert (TRANSFER_DIR, ONESHOT_SUMMARY) == (TRANSFER, SUMMARY)  # status imports these only where they exist
    src = _source(tmp_path / "src")
    probe = (
        "import json, sys\n"
        "from runners.cli import main\n"
        f"code = main(['status', {str(src)!r}, '--json'])\n"
        "heavy = sorted(m for m in sys.modules if m in ('networkx', 'scipy.stats', 'nas.cost', 'nas.spec',\n"
        "               'matplotlib', 'plotly', 'optuna', 'torch'))\n"
        "print(json.dumps({'code': code, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout[:proc.stdout.rindex("{\"code")])
    assert [p["trial"] for p in data["front"]] and data["noise"]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"code": 0, "heavy": []}


def test_status_and_report_pause_the_cyclic_collector_and_restore_it(tmp_path, monkeypatch):
    """runners.nogc: the collector is off while status and the report read (its passes over
    millions of acyclic JSON objects cost a third of status at 10,000 candidates), on after,
    also when the reader raises; on for the report's charts with the records frozen."""
    import gc

    import runners.results.experiment as experiment
    import runners.results.records as records
    from runners.cli.status import status_data
    from runners.nogc import paused_gc
    from runners.report import write_report

    src = _source(tmp_path / "src")
    seen = []
    real = records.read_index
    monkeypatch.setattr(records, "read_index", lambda *a, **kw: seen.append(gc.isenabled()) or real(*a, **kw))
    whole = experiment.read_trials  # a small experiment's report reads its records whole
    monkeypatch.setattr(experiment, "read_trials", lambda *a, **kw: seen.append(gc.isenabled()) or whole(*a, **kw))
    assert gc.isenabled()
    status_data(src)
    write_report(src)
    assert seen == [False, False] and gc.isenabled()
    # the charts: the collector on (figures' cycles freed as they go), the records frozen out
    # of its passes; as it was after, also inside the CLI's pause
    import runners.report.charts as charts
    drawn = []
    figure = charts.front_figure
    monkeypatch.setattr(charts, "front_figure", lambda *a: drawn.append((gc.isenabled(), gc.get_freeze_count() > 0))
                        or figure(*a))
    write_report(src)
    assert drawn and set(drawn) == {(True, True)} and gc.isenabled() and gc.get_freeze_count() == 0
    with paused_gc():
        write_report(src)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    assert set(drawn) == {(True, True)}
    with pytest.raises(RuntimeError), paused_gc():
        with paused_gc():  # re-entrant: the inner one leaves it off
            pass
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
