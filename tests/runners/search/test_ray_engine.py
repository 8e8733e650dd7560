"""The Ray engine's searcher without a Ray cluster: it takes the driver's jobs, so the one
study on storage holds exactly one Optuna trial per asked candidate, and the gate,
replicates, placement, an out-of-memory rerun alone and the end of the search behave as on
the local engine."""
import json
import textwrap

import optuna
import pytest

from nas.space import load_space
from runners.sweep.devices import FallbackNotice
from runners.sweep.driver import Sweep
from runners.sweep.job import Job

pytest.importorskip("ray.tune")
from runners.sweep import ray_engine  # noqa: E402
from runners.sweep.ray_engine import GateSearcher, Searcher  # noqa: E402

SPACE = """\
    name: gate
    base: tiny_noloop
    params:
      boundary: {target: loop.boundary, choices: [none, block, mixer]}
      T: {target: loop.T, choices: [2, 4], when: {boundary: [block, mixer]}}
    constraints: ["projection_flops <= 5e5"]
    objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
    proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2, seeds: 2}
    search: {sampler: grid, trials: 6, concurrency: 2, resources: {gpu: 0.5}}
    """


def complete(value: float) -> dict:
    return {"status": "complete", "measured": [{"k": None, "value": value, "metrics": {"acc": value}}]}


@pytest.fixture
def searched(tmp_path):
    """A sweep, its searcher, and how many times its study was asked."""
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(SPACE))
    sweep = Sweep(load_space(path), tmp_path / "exp", "ray")
    asked, ask = [], sweep.study.ask
    sweep.study.ask = lambda *a, **kw: asked.append(1) or ask(*a, **kw)
    key = id(sweep)
    ray_engine._LIVE[key] = (sweep, lambda: None, FallbackNotice())
    yield sweep, GateSearcher(key), asked
    ray_engine._LIVE.pop(key, None)
    sweep.close()


def job(given: dict) -> Job:
    """The job in a trial config the searcher gave Tune: plain data, read back whole."""
    return Job.model_validate(given["job"])


def suggest_all(searcher: GateSearcher) -> list[Job]:
    jobs = []
    while isinstance(given := searcher.suggest(f"ray_{len(jobs)}"), dict):
        jobs.append(job(given))
    return jobs


def test_one_optuna_trial_per_asked_candidate_and_only_gated_ones_reach_ray(searched):
    sweep, searcher, asked = searched
    jobs = suggest_all(searcher)
    assert searcher.suggest("ray_x") is None  # candidates still train: not finished yet
    trained = {r.id for r in sweep.records.values() if r.status == "running" and not r.duplicate_of}
    assert {j.trial for j in jobs} == trained and len(jobs) == 2 * len(trained)  # 2 seeds each
    assert {r.status for r in sweep.records.values()} >= {"infeasible", "running"}
    assert all(j.gpu == 0.5 and j.share == 0.5 for j in jobs)
    for j in jobs:
        sweep.on_outcome(j.id, complete(0.5))
    assert searcher.suggest("ray_y") is Searcher.FINISHED
    trials = sweep.study.get_trials(deepcopy=False)
    assert len(trials) == len(asked) == len(sweep.records) == 6
    assert sorted(t.number for t in trials) == sorted(r.number for r in sweep.records.values())
    assert optuna.trial.TrialState.RUNNING not in {t.state for t in trials}


def test_a_replicate_out_of_memory_beside_others_is_given_again_alone(searched):
    sweep, searcher, _ = searched
    first = job(searcher.suggest("ray_0"))
    sweep.on_outcome(first.id, {"status": "oom", "reason": "out of memory", "share": 0.5, "devices": ["0"],
                                "measured": []})
    again = job(searcher.suggest("ray_1"))
    assert (again.id, again.alone, again.resume, again.share) == (first.id, True, True, 1.0)
    assert ray_engine.ray_resources(sweep.space.spec.search.resources, again.alone)["gpu"] == 1.0


def test_a_job_is_plain_data_and_refuses_a_field_it_does_not_know(searched):
    from pydantic import ValidationError

    _, searcher, _ = searched
    given = searcher.suggest("ray_0")["job"]
    assert Job.model_validate(json.loads(json.dumps(given))) == Job.model_validate(given)
    with pytest.raises(ValidationError, match="gpus"):
        Job.model_validate({**given, "gpus": 1})
