"""Sweeps end to end on tiny proxies: gate, duplicates, failures, resume, elastic points,
Optuna read-back, early stopping, and a two-node Ray cluster."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from nas.space import load_space
from runners.cli.status import status_data
from runners.results.front import front
from runners.results.records import read_experiment, read_trials
from runners.sweep.run import run_sweep
from runners.sweep.stopping import ParetoHalving

PROXY = "proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}"
OBJECTIVES = "objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]"


def space_file(tmp_path, body, name="space.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def by_status(records):
    out = {}
    for r in records:
        out.setdefault(r.status, []).append(r)
    return out


def trained_dirs(exp):
    return sorted(p.name for p in (exp / "trials").iterdir() if p.is_dir())


def test_gate_prefilters_infeasible_and_trains_duplicates_once(tmp_path):
    # 6 grid points: (none, 2) and (none, 4) are one canonical spec; block T=4 breaks the
    # compute constraint.
    path = space_file(tmp_path, f"""\
        name: gate
        base: tiny_noloop
        params:
          boundary: {{target: loop.boundary, choices: [none, block, mixer]}}
          T: {{target: loop.T, choices: [2, 4], when: {{boundary: [block, mixer]}}}}
        constraints: ["projection_flops <= 5e5"]
        {OBJECTIVES}
        {PROXY}
        search: {{sampler: grid, trials: 6, concurrency: 2}}
        """)
    exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    records = read_trials(exp)
    groups = by_status(records)
    assert {s: len(v) for s, v in groups.items()} == {"complete": 4, "duplicate": 1, "infeasible": 1}
    [bad] = groups["infeasible"]
    assert bad.params == {"boundary": "block", "T": 4} and "projection_flops <= 5e5" in bad.reason
    assert not bad.rungs and bad.id not in trained_dirs(exp)  # never trained
    assert trained_dirs(exp) == sorted(r.id for r in groups["complete"])
    [dup] = groups["duplicate"]
    original = next(r for r in records if r.id == dup.duplicate_of)
    assert original.params["boundary"] == "none" and dup.spec_hash == original.spec_hash
    assert dup.points == original.points
    # every complete trial has its canonical spec, cost sheet, rungs, and a distinct hash
    assert len({r.spec_hash for r in groups["complete"]}) == 4
    assert all(r.cost["unique_params"] > 0 and [g.step for g in r.rungs] == [2, 4] for r in groups["complete"])

    # the multi-objective study reads back with plain Optuna
    storage = JournalStorage(JournalFileBackend(str(exp / "study.journal")))
    study = optuna.load_study(study_name="gate", storage=storage)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    ours = {tuple(p.values[o.name] for o in read_experiment(exp).objectives)
            for p in front(records, read_experiment(exp).objectives)}
    assert {tuple(t.values) for t in study.best_trials} == ours
    assert len(study.trials) == 6
    # each trial carries its constraint for the sampler: violated only by the infeasible one
    told = {t.user_attrs["loopnas"]["id"]: t.constraints for t in study.trials}
    assert told[bad.id]["0: projection_flops <= 5e5"] > 0
    assert all(told[r.id] == {"0: projection_flops <= 5e5": 0.0} for r in groups["complete"])


def test_failed_and_diverged_trials_are_recorded_and_the_sweep_goes_on(tmp_path):
    path = space_file(tmp_path, f"""\
        name: failing
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.003, 10000.0]}}
          init: {{target: proxy.init_from, choices: [null, "missing/checkpoint.pt"]}}
        {OBJECTIVES}
        proxy: {{task: s5, task_params: {{seq_len: 4, degree: 2}}, steps: 4, batch_size: 4, eval_every: 2,
                warmup_steps: 0, min_lr: 0.0}}
        search: {{sampler: grid, trials: 4, concurrency: 2}}
        """)
    exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    groups = by_status(read_trials(exp))
    assert len(groups["complete"]) == 1 and len(groups["failed"]) == 3
    reasons = {(r.params["lr"], r.params["init"]): r.reason for r in groups["failed"]}
    assert "non-finite training loss" in reasons[(10000.0, None)]
    # a problem only training can meet (validate already names a bad task parameter)
    assert "missing/checkpoint.pt" in reasons[(0.003, "missing/checkpoint.pt")]
    data = status_data(exp)
    assert data["failed"] == 3 and data["complete"] == 1 and len(data["front"]) == 1
    assert {"complete", "pruned", "failed", "infeasible", "running", "front"} <= set(data)


def test_a_trial_past_its_time_limit_is_recorded_as_timed_out(tmp_path):
    path = space_file(tmp_path, f"""\
        name: slow
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.001]}}
        {OBJECTIVES}
        {PROXY}
        search: {{sampler: grid, trials: 1, concurrency: 1, trial_timeout: 0.001,
                  storage: "sqlite:///{tmp_path}/study.db"}}
        """)
    exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    [record] = read_trials(exp)
    assert record.status == "timeout" and "time limit" in record.reason
    assert [g.step for g in record.rungs] == [2]  # stopped at its first evaluation
    # the study lives in the RDB named by search.storage, not in the journal
    study = optuna.load_study(study_name="slow", storage=f"sqlite:///{tmp_path}/study.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]
    assert not (exp / "study.journal").exists()


@pytest.mark.slow
def test_kill_minus_9_then_resume_finishes_exactly_the_requested_trials(tmp_path):
    path = space_file(tmp_path, f"""\
        name: resumable
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.001, 0.002, 0.003, 0.004]}}
        {OBJECTIVES}
        proxy: {{task: s5, task_params: {{seq_len: 8, degree: 3}}, steps: 60, batch_size: 8, eval_every: 10}}
        search: {{sampler: grid, trials: 4, concurrency: 2}}
        """)
    exp = tmp_path / "exp"
    cmd = [sys.executable, "-m", "runners", "sweep", str(path), "--out", str(exp)]
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        records = read_trials(exp) if (exp / "trials").is_dir() else []
        if any(r.status == "running" and r.rungs for r in records):
            break
        assert driver.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    interrupted = [r.id for r in read_trials(exp) if r.status == "running"]
    assert interrupted
    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete"] * 4
    assert sorted(r.params["lr"] for r in records) == [0.001, 0.002, 0.003, 0.004]
    assert {r.id for r in records} >= set(interrupted)  # re-run under their own ids
    assert all(r.rungs[-1].step == 60 for r in records)
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and len(read_trials(exp)) == 4  # nothing repeated


def test_elastic_trials_add_one_front_point_per_loop_count(tmp_path):
    path = space_file(tmp_path, f"""\
        name: elastic
        base: tiny_elr
        params:
          switch: {{target: elastic.switch_at, choices: [0.0, 0.5]}}
        {OBJECTIVES}
        {PROXY}
        search: {{sampler: grid, trials: 2, concurrency: 2}}
        """)
    exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete", "complete"]
    for r in records:
        assert [p.k for p in r.points] == [1, 2, 3, 4]
        flops = [p.values["projection_flops"] for p in r.points]
        assert flops == sorted(flops) and len(set(flops)) == 4  # compute grows with k
    data = status_data(exp)
    assert data["elastic_trials"] == 2
    assert all(p["k"] in (1, 2, 3, 4) for p in data["front"])


def test_pareto_halving_only_stops_trials_beaten_by_no_costlier_peers():
    rule = ParetoHalving(rungs=(10,), margin=0.05)
    assert not rule.decide("cheap_good", 10, (1.0,), 0.8)
    assert not rule.decide("costly_bad", 5, (3.0,), 0.1)  # not a rung
    assert rule.decide("costly_bad", 10, (3.0,), 0.5)     # a cheaper trial beats it by 0.3
    assert not rule.decide("cheaper_bad", 10, (0.5,), 0.1)  # only costlier peers beat it
    assert not rule.decide("close", 10, (2.0,), 0.78)     # within the margin
    assert rule.beaten_by("costly_bad", 10) == ["cheap_good", "close"]
    two = ParetoHalving(rungs=(10,), min_beaten_by=2)
    two.decide("a", 10, (1.0, 1.0), 0.9)
    assert not two.decide("b", 10, (2.0, 0.5), 0.1)  # a is cheaper in one objective only
    assert not two.decide("c", 10, (2.0, 2.0), 0.1)  # beaten by one, two needed
    assert two.decide("d", 10, (3.0, 3.0), 0.0)


def test_early_stopping_prunes_and_never_against_the_rule(tmp_path):
    path = space_file(tmp_path, f"""\
        name: halving
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.01, 0.00000001, 0.00000002, 0.00000003]}}
          boundary: {{target: loop.boundary, choices: [none, block]}}
          T: {{target: loop.T, choices: [2], when: {{boundary: [block]}}}}
        {OBJECTIVES}
        proxy: {{task: s5, task_params: {{seq_len: 6, degree: 3}}, steps: 30, batch_size: 16, eval_every: 10,
                warmup_steps: 0, min_lr: 0.0}}
        search: {{sampler: grid, trials: 8, concurrency: 1, early_stopping: {{rungs: [10, 20], margin: 0.0}}}}
        """)
    exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    records = read_trials(exp)
    pruned = [r for r in records if r.status == "pruned"]
    assert pruned, [(r.id, r.status, [g.quality for g in r.rungs]) for r in records]
    for r in pruned:
        rung = r.rungs[-1]
        assert rung.step in (10, 20) and rung.step < 30
        mine = r.points or None
        cost = r.cost["projection_flops_per_token"]
        beaters = [o for o in records if o.id != r.id and o.cost["projection_flops_per_token"] <= cost
                   and any(g.step == rung.step and g.quality > rung.quality for g in o.rungs)]
        assert beaters and mine is None
    complete = [r for r in records if r.status == "complete"]
    assert complete and all(r.rungs[-1].step == 30 for r in complete)
    assert {r.status for r in records} == {"complete", "pruned"}


@pytest.mark.slow
def test_ray_cluster_of_two_nodes_is_joined_with_address(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        path = space_file(tmp_path, f"""\
            name: cluster
            base: tiny_noloop
            params:
              lr: {{target: proxy.lr, choices: [0.001, 0.002, 0.003, 0.004]}}
            {OBJECTIVES}
            proxy: {{task: s5, task_params: {{seq_len: 8, degree: 3}}, steps: 30, batch_size: 8, eval_every: 10}}
            search: {{sampler: grid, trials: 4, concurrency: 2, resources: {{cpu: 1}}}}
            """)
        exp = run_sweep(path, out=tmp_path / "exp", engine="ray", address=cluster.address, progress=False)
    finally:
        cluster.shutdown()
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete"] * 4
    assert len({r.node for r in records}) == 2, [r.node for r in records]
    assert read_experiment(exp).engine == "ray"


def test_cli_sweep_errors_are_one_line(tmp_path):
    path = space_file(tmp_path, f"""\
        name: cli
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.001]}}
        {OBJECTIVES}
        {PROXY}
        """)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment.json").write_text(json.dumps({"name": "x"}))
    for args, message in [
        (["--out", str(tmp_path / "exp")], "already holds an experiment; pass --resume"),
        (["--out", str(tmp_path / "new"), "--resume"], "holds no experiment to resume"),
        (["--out", str(tmp_path / "new"), "--engine", "dask"], "'dask' is not one of 'optuna', 'ray'"),
        (["--out", str(tmp_path / "new"), "--address", "auto"], "--address joins a Ray cluster"),
    ]:
        run = subprocess.run([sys.executable, "-m", "runners", "sweep", str(path), *args],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert message in run.stderr


@pytest.mark.parametrize("proxy, message", [
    ("proxy: {task: s5, steps: 4, lr: 0.0001}", "proxy: min_lr (0.0003) exceeds lr (0.0001)"),
    ("proxy: {task: s5, steps: 4, batch_sise: 4}", "proxy.batch_sise: unknown field 'batch_sise'"),
    ("proxy: {task: s5, steps: 4, task_params: {degree: 9}}", "proxy.task_params: task 's5': degree must be in 2..6"),
    ("proxy: {task: s55, steps: 4}", "proxy.task: unknown task 's55'"),
])
def test_a_bad_proxy_is_one_error_before_any_trial(tmp_path, proxy, message):
    path = space_file(tmp_path, f"""\
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.001]}}
        {OBJECTIVES}
        {proxy}
        """)
    run = subprocess.run([sys.executable, "-m", "runners", "sweep", str(path), "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}: {message}"), run.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("sampler", ["gp", "tpe", "nsga2", "random"])
def test_constraints_go_on_the_trial_not_through_the_deprecated_constraints_func(tmp_path, sampler):
    """Optuna 5 deprecates the samplers' ``constraints_func``: the gate sets each trial's
    constraints (``Trial.set_constraint``), which every constraint-aware sampler reads."""
    import warnings

    from runners.sweep.driver import make_sampler

    path = space_file(tmp_path, f"""\
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [0.001, 0.002]}}
        constraints: ["projection_flops <= 5e5"]
        {OBJECTIVES}
        {PROXY}
        search: {{sampler: {sampler}}}
        """)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        made = make_sampler(load_space(path), 8)
    assert getattr(made, "_constraints_func", None) is None
