"""Trials on GPUs, proven on a CPU: which trial gets which device, how many share one, what
an out-of-memory error does, and several drivers sharing one study.

No GPU is needed: ``CUDA_VISIBLE_DEVICES`` (local backend) or a Ray cluster's declared GPUs
name devices that are not there, so every trial trains on CPU, but each worker sees only
the devices it was given and records them; start and finish times show how many ran on a
device at once. Out-of-memory errors are raised inside real trials by the test hook of
``runners.sweep.trial`` (``LOOPNAS_TEST_OOM``)."""
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from pydantic import ValidationError

from nas.space import ResourcesSpec, load_space
from runners.cli.status import status_data
from runners.sweep.devices import DevicePool, PoolError, packing, parse_visible, ray_resources, visible
from runners.sweep.driver import Sweep
from runners.results.records import read_trials
from runners.sweep.run import run_sweep
from helpers import REPO

ROOT = REPO
OBJECTIVES = "objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]"
PROXY = "proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}"


def space_file(tmp_path, search, n=8, name="gpus"):
    lrs = ", ".join(f"{0.001 * (i + 1):.3f}" for i in range(n))
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        base: tiny_noloop
        params:
          lr: {{target: proxy.lr, choices: [{lrs}]}}
        {OBJECTIVES}
        {PROXY}
        search: {search}
        """))
    return path


def intervals(records):
    """(device, start, finish) of every replicate that ran."""
    return [(d, rep.started, rep.finished) for r in records for rep in r.replicates for d in rep.devices]


def most_at_once(spans) -> int:
    """The most intervals open at one moment."""
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def fallback_lines(caplog):
    return [r for r in caplog.records if r.name == "loopnas.sweep" and "train on CPU" in r.getMessage()]


def test_packing_and_the_pool():
    assert [packing(f) for f in (0, 0.25, 0.3, 0.5, 1, 1.5, 2)] == [(0, 0), (4, 1), (3, 1), (2, 1), (1, 1), (1, 2), (1, 2)]
    assert parse_visible("0,2,-1,3") == ["0", "2"] and parse_visible("") == [] and parse_visible(None) is None
    assert visible({"CUDA_VISIBLE_DEVICES": "GPU-ab12,GPU-cd34"}) == ["GPU-ab12", "GPU-cd34"]
    assert visible({}) == ["cpu"]

    pool = DevicePool(0.5, ["0", "1"])
    assert pool.capacity == 4
    got = [pool.acquire() for _ in range(4)]
    assert [p.devices for p in got] == [("0",), ("1",), ("0",), ("1",)]  # spread, then packed
    assert pool.acquire() is None
    pool.release(got[1])
    assert pool.acquire(alone=True) is None  # both devices busy: device 1 is drained for it
    assert pool.acquire() is None  # its free slot is held for the rerun
    pool.release(got[3])
    alone = pool.acquire(alone=True)
    assert alone.devices == ("1",) and pool.acquire() is None  # a whole device to itself
    pool.release(alone)
    assert pool.acquire().devices == ("1",)

    wide = DevicePool(1.5, ["0", "1", "2", "3", "4"])
    assert wide.capacity == 2 and wide.acquire().devices == ("0", "1")
    with pytest.raises(PoolError, match="needs 2 GPUs per trial; 1 visible"):
        DevicePool(2, ["0"])
    assert DevicePool(0.5, []).acquire().devices == ()  # no GPU: the CPU takes any number


def test_accelerator_type_is_a_ray_resource_and_validated_as_a_string():
    res = ResourcesSpec(cpu=2, gpu=0.25, accelerator_type="H100")
    assert ray_resources(res) == {"cpu": 2, "gpu": 0.25, "accelerator_type:H100": 0.001}
    assert ray_resources(res, alone=True)["gpu"] == 1.0
    for bad in (100, "H100 80GB", ""):
        with pytest.raises(ValidationError, match="accelerator_type"):
            ResourcesSpec(accelerator_type=bad)


@pytest.mark.slow
def test_local_backend_packs_two_trials_per_visible_gpu(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    path = space_file(tmp_path, "{sampler: grid, trials: 8, concurrency: 8, resources: {gpu: 0.5}}")
    with caplog.at_level(logging.WARNING, logger="loopnas.sweep"):
        exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete"] * 8
    # each worker saw only its own device (its CUDA_VISIBLE_DEVICES) and trained on CPU
    assert all(len(r.devices) == 1 and r.replicates[0].ran_on == "cpu" for r in records)
    spans = intervals(records)
    by_device = {d: [(s, f) for dd, s, f in spans if dd == d] for d in "0123"}
    assert {d: len(v) for d, v in by_device.items()} == {"0": 2, "1": 2, "2": 2, "3": 2}
    assert all(most_at_once(v) <= 2 for v in by_device.values())
    assert status_data(exp)["devices"] == {"0": 2, "1": 2, "2": 2, "3": 2}
    assert len(fallback_lines(caplog)) == 1  # one warning line for the whole sweep


def test_out_of_memory_is_recorded_and_rerun_alone_on_a_whole_device(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    # t0001 runs out of memory only beside a neighbour, t0002 even alone
    monkeypatch.setenv("LOOPNAS_TEST_OOM", "t0001,t0002:always")
    path = space_file(tmp_path, "{sampler: grid, trials: 4, concurrency: 4, resources: {gpu: 0.5}}", n=4)
    exp = run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
    records = {r.id: r for r in read_trials(exp)}
    assert {i: r.status for i, r in records.items()} == {"t0000": "complete", "t0001": "complete",
                                                         "t0002": "oom", "t0003": "complete"}
    oom = records["t0002"]
    assert "out of memory" in oom.reason and "LOOPNAS_TEST_OOM" in oom.reason
    assert "peak_memory" in oom.model_dump()  # the CUDA peak; None here, on CPU
    for rid in ("t0001", "t0002"):  # each met its OOM beside a neighbour, then ran alone
        [rep] = records[rid].replicates
        assert "out of memory" in rep.retried
        [device] = rep.devices
        others = [(s, f) for d, s, f in intervals(r for r in records.values() if r.id != rid) if d == device]
        assert all(f <= rep.started or s >= rep.finished for s, f in others), (rid, device)
    assert status_data(exp)["oom"] == 1


def test_on_oom_fail_ends_the_candidate_without_a_rerun(tmp_path):
    path = space_file(tmp_path, "{sampler: grid, trials: 1, concurrency: 1, on_oom: fail, resources: {gpu: 0.5}}", n=1)
    sweep = Sweep(load_space(path), tmp_path / "exp", "optuna")
    job = sweep.next_job()
    sweep.on_outcome(job.id, {"status": "oom", "reason": "out of memory: CUDA out of memory", "share": 0.5,
                          "devices": ["0"], "peak_memory": 123, "measured": []})
    assert sweep.next_job() is None
    [record] = read_trials(tmp_path / "exp")
    assert record.status == "oom" and record.peak_memory == 123 and record.devices == ["0"]
    assert [t.state for t in sweep.study.get_trials()] == [optuna.trial.TrialState.FAIL]


def test_two_drivers_on_one_sqlite_study_run_its_budget_once(tmp_path):
    db = tmp_path / "study.db"
    path = space_file(tmp_path, f'{{sampler: random, trials: 6, concurrency: 1, storage: "sqlite:///{db}"}}', n=8)
    optuna.storages.RDBStorage(f"sqlite:///{db}")  # the schema, made once (two first connections race on it)
    code = "import sys; from runners.sweep.run import run_sweep; run_sweep(sys.argv[1], out=sys.argv[2], progress=False)"
    drivers = [subprocess.Popen([sys.executable, "-c", code, str(path), str(tmp_path / out)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for out in ("a", "b")]
    for d in drivers:
        assert d.wait(timeout=300) == 0, d.stderr.read()[-2000:]
    records = read_trials(tmp_path / "a") + read_trials(tmp_path / "b")
    assert len(records) == 6 and {r.status for r in records} <= {"complete", "duplicate"}
    trials = optuna.load_study(study_name="gpus", storage=f"sqlite:///{db}").trials
    used = [t for t in trials if t.user_attrs.get("loopnas", {}).get("status") != "withdrawn"]
    assert len(used) == 6 and {t.state for t in used} == {optuna.trial.TrialState.COMPLETE}
    assert sorted(t.number for t in used) == sorted(r.number for r in records)


@pytest.mark.slow
def test_ray_cluster_with_declared_gpus_packs_four_trials(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 8, "num_gpus": 2, "include_dashboard": False, "resources": {"accelerator_type:TESTGPU": 1}})
    try:
        path = space_file(tmp_path, "{sampler: grid, trials: 6, concurrency: 8, "
                                    "resources: {cpu: 1, gpu: 0.5, accelerator_type: TESTGPU}}", n=6)
        with caplog.at_level(logging.WARNING, logger="loopnas.sweep"):
            exp = run_sweep(path, out=tmp_path / "exp", engine="ray", address=cluster.address, progress=False)
    finally:
        cluster.shutdown()
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete"] * 6
    assert all(len(r.devices) == 1 and r.devices[0] in ("0", "1") for r in records), [r.devices for r in records]
    spans = intervals(records)
    assert most_at_once([(s, f) for _, s, f in spans]) <= 4
    assert all(most_at_once([(s, f) for d, s, f in spans if d == g]) <= 2 for g in ("0", "1"))
    assert len(fallback_lines(caplog)) == 1


def test_a_share_too_small_to_schedule_is_one_error():
    from runners.sweep.devices import MIN_SHARE

    for gpu in (5e-324, MIN_SHARE / 2):
        with pytest.raises(PoolError, match="below the smallest share"):
            DevicePool(gpu, ["0"])
        with pytest.raises(PoolError, match="resources.gpu"):
            ray_resources(ResourcesSpec(gpu=gpu))
    assert packing(MIN_SHARE) == (10_000, 1)


@pytest.mark.parametrize("visible, gpu", [("0,0", 2), ("0,1,0", 0.5), ("GPU-ab,GPU-ab", 1)])
def test_a_device_listed_twice_is_one_error_naming_the_variable(visible, gpu):
    with pytest.raises(PoolError, match=f"CUDA_VISIBLE_DEVICES={visible} names GPU .* twice"):
        DevicePool.from_env(gpu, {"CUDA_VISIBLE_DEVICES": visible})
    assert DevicePool.from_env(0, {"CUDA_VISIBLE_DEVICES": visible}).acquire().devices == ()  # no GPU asked


def test_a_sweep_on_a_device_listed_twice_stops_before_training(tmp_path, monkeypatch):
    from runners.sweep.driver import SweepError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    path = space_file(tmp_path, "{sampler: grid, trials: 2, concurrency: 2, resources: {gpu: 2}}", n=2)
    with pytest.raises(SweepError, match="CUDA_VISIBLE_DEVICES=0,0 names GPU 0 twice"):
        run_sweep(path, out=tmp_path / "exp", engine="optuna", progress=False)
