"""The worker's answer is typed data like its job: a field one side does not know fails by
name, a status no run ends with is refused, and it crosses JSON (Ray) with a diverged
metric intact. The trainer's result and a bad setting become one outcome; the experiment
record names the engine and still reads the ones written before it did."""
import json
import math

import pytest
from pydantic import ValidationError

from helpers import arch
from runners.results.records import EXPERIMENT, read_experiment
from runners.sweep.job import Job
from runners.sweep.outcome import Outcome
from runners.sweep.trial import run_trial


def test_an_outcome_refuses_a_field_or_a_status_it_does_not_know():
    with pytest.raises(ValidationError, match="meassured"):
        Outcome.model_validate({"status": "complete", "meassured": []})
    with pytest.raises(ValidationError, match="must be one of complete, pruned"):
        Outcome(status="running")
    with pytest.raises(ValidationError, match="frozen"):
        Outcome(status="failed").status = "complete"


def test_an_outcome_crosses_json_with_a_diverged_metric():
    sent = Outcome(status="complete", rungs=[{"step": 2, "quality": float("nan")}],
                   measured=[{"value": float("nan"), "metrics": {"acc": float("nan")}}], devices=("0",))
    got = Outcome.model_validate_json(sent.model_dump_json())
    assert math.isnan(got.measured[0].value) and math.isnan(got.rungs[0].quality) and got.devices == ("0",)
    assert Outcome.of(got.model_dump()).measured[0].k is None and Outcome.of(got) is got


def test_a_bad_setting_is_a_failed_outcome_in_the_projects_words(tmp_path):
    job = Job(id="t0000", trial="t0000", replicate=0, arch=arch("tiny_noloop").model_dump(mode="json"),
              config={"task": "s5", "steps": 2, "lr": -1.0}, dir=str(tmp_path / "run"), metric="acc")
    outcome = run_trial(job, lambda rung: True)
    assert isinstance(outcome, Outcome) and outcome.status == "failed" and not outcome.crashed
    assert outcome.reason.startswith("invalid TrainConfig settings: lr: should be greater than 0"), outcome.reason
    assert outcome.finished >= outcome.started and outcome.devices == ("cpu",)


def test_the_experiment_record_names_the_engine_and_reads_the_format_before_it(tmp_path):
    from runners.results.records import ExperimentRecord, write_json

    write_json(tmp_path / EXPERIMENT, ExperimentRecord(name="e", space={}, objectives=[], engine="ray", trials=2,
                                                       created=0.0, seq_len=8))
    data = json.loads((tmp_path / EXPERIMENT).read_text())
    assert data["engine"] == "ray" and data["format"] == 2 and "backend" not in data
    old = {k: v for k, v in data.items() if k not in ("engine", "format")} | {"backend": "optuna"}
    (tmp_path / EXPERIMENT).write_text(json.dumps(old))  # as written before the engine had its name
    record = read_experiment(tmp_path)
    assert record.engine == "optuna" and record.format == 2
