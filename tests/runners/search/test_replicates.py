"""Seed replicates in the sweep driver: jobs per seed, means and standard errors, a failed
replicate, resume of a half-finished replicate set, duplicates, and one real sweep."""
import json
import math
import subprocess
import sys
import textwrap

import optuna
import pytest

from nas.space import load_space
from runners.cli.status import status_data
from runners.sweep.driver import Sweep
from runners.results.front import front
from runners.results.records import read_experiment, read_trials
from runners.sweep.run import run_sweep

PROXY = "{task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2, seeds: 3}"


def space(tmp_path, seeds=3, extra=""):
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: reps
        base: tiny_noloop
        params:
          boundary: {{target: loop.boundary, choices: [none, block]}}
          T: {{target: loop.T, choices: [2], when: {{boundary: [block]}}}}
        objectives: [{{metric: acc, direction: maximize}}, {{metric: projection_flops, direction: minimize}}]
        proxy: {PROXY.replace("seeds: 3", f"seeds: {seeds}")}
        search: {{sampler: grid, trials: 2, concurrency: 2{extra}}}
        """))
    return load_space(path)


def outcome(value, status="complete", reason=None):
    return {"status": status, "reason": reason,
            "measured": [{"k": None, "value": value, "metrics": {"acc": value}}] if status == "complete" else []}


def test_each_candidate_runs_one_job_per_seed_and_reports_the_mean(tmp_path):
    sweep = Sweep(space(tmp_path), tmp_path / "exp", "optuna")
    jobs = [sweep.next_job() for _ in range(6)]
    assert sweep.next_job() is None  # 2 candidates × 3 seeds, then the budget is spent
    first = [j for j in jobs if j.trial == jobs[0].trial]
    assert [j.replicate for j in first] == [0, 1, 2]
    assert [j.config["seed"] for j in first] == [0, 1, 2]
    assert {j.config["eval_seed"] for j in jobs} == {0}  # common eval batches
    assert len({j.dir for j in jobs}) == 6 and "seeds" not in jobs[0].config
    values = {jobs[0].trial: [0.5, 0.6, 0.7], jobs[3].trial: [0.2, 0.2, 0.2]}
    for job in jobs:
        sweep.on_outcome(job.id, outcome(values[job.trial][job.replicate]))
    records = {r.id: r for r in read_trials(tmp_path / "exp")}
    a = records[jobs[0].trial]
    assert a.status == "complete" and len(a.replicates) == 3
    assert a.points[0].values["acc"] == pytest.approx(0.6) and a.points[0].n == 3
    assert a.points[0].se["acc"] == pytest.approx(0.1 / math.sqrt(3))
    assert a.points[0].se["projection_flops"] == 0.0
    [t] = [t for t in sweep.study.get_trials() if t.user_attrs["loopnas"]["id"] == a.id]
    assert t.values[0] == pytest.approx(0.6)  # the study is told the mean


def test_a_failed_replicate_fails_its_candidate_with_its_reason(tmp_path):
    sweep = Sweep(space(tmp_path), tmp_path / "exp", "optuna")
    jobs = [sweep.next_job() for _ in range(2)]  # two replicates of the first candidate
    sweep.on_outcome(jobs[1].id, outcome(None, "failed", "loss is NaN at step 3"))
    # the third replicate is not started; the first still runs and is told to stop
    assert all(j.trial != jobs[0].trial for j in sweep.queue)
    assert sweep.on_rung(jobs[0].id, __import__("runners.results.records", fromlist=["Rung"]).Rung(step=2)) is False
    sweep.on_outcome(jobs[0].id, outcome(None, "pruned", "stopped early at step 2"))
    record = sweep.records[jobs[0].trial]
    assert record.status == "failed" and record.reason == "replicate 1 (seed 1): loss is NaN at step 3"
    assert [r.status for r in record.replicates] == ["pruned", "failed", "queued"]


def test_resume_reruns_only_unfinished_replicates(tmp_path):
    exp = tmp_path / "exp"
    sweep = Sweep(space(tmp_path), exp, "optuna")
    jobs = [sweep.next_job() for _ in range(3)]
    from runners.results.records import Rung
    sweep.on_rung(jobs[2].id, Rung(step=2, quality=0.4))
    sweep.on_outcome(jobs[0].id, outcome(0.5))
    sweep.on_outcome(jobs[1].id, outcome(0.6))
    sweep.interrupted()  # killed with replicate 2 half-way
    resumed = Sweep(space(tmp_path), exp, "optuna", resume=True)
    job = resumed.next_job()
    assert job.trial == jobs[0].trial and job.replicate == 2 and job.resume
    record = resumed.records[job.trial]
    assert [r.status for r in record.replicates] == ["complete", "complete", "running"]
    assert [r.step for r in record.replicates[2].rungs] == [2]  # rungs before the resume point kept
    resumed.on_rung(job.id, Rung(step=4, quality=0.7))
    resumed.on_outcome(job.id, outcome(0.7))
    record = resumed.records[job.trial]
    assert record.status == "complete" and record.points[0].values["acc"] == pytest.approx(0.6)
    assert [r.step for r in record.replicates[2].rungs] == [2, 4]


def test_a_resume_must_keep_the_seed_count(tmp_path):
    Sweep(space(tmp_path), tmp_path / "exp", "optuna").interrupted()
    from runners.sweep.driver import SweepError
    with pytest.raises(SweepError, match="--seeds 3"):
        Sweep(space(tmp_path), tmp_path / "exp", "optuna", resume=True, seeds=2)


def test_duplicates_reuse_every_replicate(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: dup
        base: tiny_noloop
        params:
          boundary: {{target: loop.boundary, choices: [none]}}
          T: {{target: loop.T, choices: [2, 4], when: {{boundary: [block]}}}}
        objectives: [{{metric: acc, direction: maximize}}, {{metric: projection_flops, direction: minimize}}]
        proxy: {PROXY.replace("seeds: 3", "seeds: 2")}
        search: {{sampler: grid, trials: 2, concurrency: 1}}
        """))
    sweep = Sweep(load_space(path), tmp_path / "exp", "optuna")
    jobs = [sweep.next_job(), sweep.next_job()]
    for j, v in zip(jobs, (0.3, 0.5)):
        sweep.on_outcome(j.id, outcome(v))
    assert sweep.next_job() is None  # the second grid point is the same canonical spec
    [dup] = [r for r in sweep.records.values() if r.status == "duplicate"]
    assert dup.points[0].values["acc"] == pytest.approx(0.4) and dup.points[0].n == 2


def test_the_budget_is_counted_as_records_are_written(tmp_path):
    """``budget_used`` keeps its count as records change; it is what a count over every
    record gives, from the first ask to a resume."""
    def recount(sweep):
        settled = sum(r.status in sweep.final for r in sweep.records.values())
        return settled + len(sweep.active) + sum(map(len, sweep.scheduler.waiting.values()))

    sweep = Sweep(space(tmp_path), tmp_path / "exp", "optuna")
    jobs = []
    while (job := sweep.next_job()) is not None:
        assert sweep.budget_used() == recount(sweep) > 0
        jobs.append(job)
    for job, status in zip(jobs, ["complete", "failed", "complete", "complete", "pruned", "complete"]):
        sweep.on_outcome(job.id, outcome(0.5 if status == "complete" else None, status))
        assert sweep.budget_used() == recount(sweep)
    assert sweep.budget_used() == 2 and not sweep.wants_more()
    sweep.close()
    resumed = Sweep(space(tmp_path), tmp_path / "exp", "optuna", resume=True)
    assert resumed.budget_used() == recount(resumed) == 2 and resumed.next_job() is None
    resumed.close()


def test_real_sweep_with_replicates_status_and_report(tmp_path):
    sp = space(tmp_path, seeds=2)
    exp = run_sweep(sp, out=tmp_path / "exp", engine="optuna", progress=False)
    assert read_experiment(exp).seeds == 2
    records = [r for r in read_trials(exp) if r.status == "complete"]
    assert len(records) == 2
    for r in records:
        assert [rep.seed for rep in r.replicates] == [0, 1]
        assert sorted(p.name for p in (exp / "trials" / r.id).iterdir()) == ["s0", "s1"]
        assert "acc" in r.points[0].se and r.points[0].n == 2
        assert [g.step for g in r.rungs] == [2, 4]
    data = status_data(exp)
    assert data["seeds"] == 2 and data["noise"]
    for p in data["front"]:
        assert set(p["se"]) == {"acc", "projection_flops"} and p["se"]["projection_flops"] == 0.0
        assert 0.0 <= p["p_front"] <= 1.0
    # the status table shows p_front and the noise sentence
    run = subprocess.run([sys.executable, "-m", "runners", "status", str(exp)], capture_output=True, text=True,
                         env={**__import__("os").environ, "COLUMNS": "200"})
    assert run.returncode == 0 and "p_front" in run.stdout and "seed" in run.stdout
    from runners.report import write_report
    report = write_report(exp)
    html = report.index.read_text()
    assert "seed noise" in html.lower() and "p_front" in html and "error_y" in html
    rows = report.csv.read_text().splitlines()
    assert "acc_se" in rows[0] and "p_front" in rows[0]


def test_the_progress_line_counts_and_ranks_means_without_the_bootstrap(tmp_path, monkeypatch):
    import runners.results.front as front_module
    from runners.sweep.driver import Sweep
    from runners.results.front import front
    from runners.sweep.run import _Line

    def no_bootstrap(*args, **kw):
        raise AssertionError("the progress line ran the bootstrap")

    sweep = Sweep(space(tmp_path), tmp_path / "exp", "optuna")
    line = _Line(sweep)
    jobs = [sweep.next_job() for _ in range(6)]
    values = {jobs[0].trial: [0.5, 0.6, 0.7], jobs[3].trial: [0.2, 0.3, 0.2]}
    monkeypatch.setattr(front_module, "p_front", no_bootstrap)
    monkeypatch.setattr("nas.noise.p_front", no_bootstrap)
    for job in jobs:
        assert line.counts() == sweep.counts()
        sweep.on_outcome(job.id, outcome(values[job.trial][job.replicate]))
    assert line.counts() == sweep.counts() and line.counts()["complete"] == 2
    monkeypatch.undo()
    members = [p.trial for p in front(list(sweep.records.values()), sweep.objectives)]
    assert line.text(line.counts()).endswith("front: " + ", ".join(members))
