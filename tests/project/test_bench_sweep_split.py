"""benchmarks/bench_sweep_split.py's accounting, on fabricated timestamps (no sweep): every
slot-second lands in exactly one category."""
import importlib.util
from pathlib import Path

import pytest
from helpers import REPO

ROOT = REPO


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sweep_split", ROOT / "benchmarks" / "bench_sweep_split.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job(started, finished, **timings):
    return {"started": started, "finished": finished, "result": {"timings": timings}}


def test_two_workers_split_into_start_trials_driver_and_idle(bench):
    """Sweep from 0 to 30 s on two slots. Worker A is created at 1, trains 3–10 and 12–20;
    worker B is created at 2 and trains 4–25. The driver is busy 10–11 (A's gap) and 26–27
    (B's tail)."""
    probe = bench.Probe()
    probe.created = {1: 1.0, 2: 2.0}
    probe.given = {1: ["e/t0", "e/t1"], 2: ["e/t2"]}
    probe.busy = [(10.0, 11.0), (26.0, 27.0)]
    reps = {"e/t0": job(3, 10, build=1, steps=4, eval=1, checkpoint=0, callback=0.5),
            "e/t1": job(12, 20, build=1, steps=5, eval=1, checkpoint=0, callback=0),
            "e/t2": job(4, 25, build=2, steps=15, eval=2, checkpoint=1, callback=0)}
    s = bench.split(probe, reps, 0.0, 30.0, concurrency=2)
    assert sum(s.values()) == pytest.approx(60.0)
    assert s["driver start"] == 1 + 2 and s["worker start"] == (3 - 1) + (4 - 2)
    assert (s["build"], s["train steps"], s["evaluation"], s["checkpoint"], s["rung reports"]) == (4, 24, 4, 1, 0.5)
    assert s["trial, outside train()"] == pytest.approx(0.5 + 1 + 1)
    # A's gap 10–12 holds 10–11; both tails (A 20–30, B 25–30) hold 26–27: the slots wait alike
    assert s["records/Optuna"] == 1 + 1 + 1
    assert s["idle"] == pytest.approx(1 + 9 + 4)


def test_a_slot_without_a_worker_is_idle(bench):
    probe = bench.Probe()
    s = bench.split(probe, {}, 0.0, 10.0, concurrency=2)
    assert s["idle"] == 20 and sum(s.values()) == 20
