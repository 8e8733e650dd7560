"""Length extrapolation: a trained proxy evaluated once at the end on longer task settings."""
from __future__ import annotations

from pathlib import Path

import pytest

from nas import load_arch
from runners.train import CurriculumConfig, TrainConfig, train
from helpers import REPO

ROOT = REPO


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread


def config(**kw) -> TrainConfig:
    base = dict(steps=3, batch_size=4, warmup_steps=1, eval_every=3, eval_batches=1, progress=False)
    return TrainConfig(**{**base, **kw})


def tiny():
    return load_arch(ROOT / "spaces" / "archs" / "tiny_noloop.yaml")


def test_s5_evaluated_at_longer_lengths():
    result = train(tiny(), config(task="s5", task_params={"seq_len": 8},
                                  extrapolate=({"seq_len": 32}, {"seq_len": 64})))
    assert result.status == "ok"
    assert [p.seq_len for p in result.extrapolation] == [32, 64]
    assert [p.params for p in result.extrapolation] == [{"seq_len": 32}, {"seq_len": 64}]
    for point in result.extrapolation:
        assert 0 <= point.metrics["acc"] <= 1 and point.metrics["eval_loss"] > 0
    assert result.final["eval_loss"] != result.extrapolation[1].metrics["eval_loss"]


def test_state_tracking_curriculum_evaluated_with_more_steps():
    curriculum = CurriculumConfig(stages=(2, 4), threshold=1.0, stage_steps=2)
    result = train(tiny(), config(task="state_tracking", task_params={}, steps=None,
                                  curriculum=curriculum, eval_every=2,
                                  extrapolate=({"n": 8}, {"n": 16})))
    assert result.curriculum["n_max"] == 0  # stuck at the first stage, m = 2
    assert [p.seq_len for p in result.extrapolation] == [3 + 4 + 8 * 4, 3 + 4 + 16 * 4]
    assert {"acc", "last_acc", "seq_acc"} <= set(result.extrapolation[0].metrics)
    assert result.quality_metric == "n_max" and result.curriculum["metric"] == "last_acc"


def test_plain_state_tracking_quality_is_the_last_answer():
    result = train(tiny(), config(task="state_tracking", task_params={"n": 4, "m": 4, "max_m": 4}))
    assert result.quality_metric == "last_acc"
    assert result.quality == result.final["last_acc"]


@pytest.mark.parametrize(
    "task, params, match",
    [("s5", {"length": 64}, "no parameter"), ("s5", {"degree": 4}, "vocab"),
     ("lm", {"seq_len": 64}, "no parameter")],
)
def test_bad_extrapolation_fails_before_training(task, params, match, tmp_path):
    task_params = {"seq_len": 8}
    if task == "lm":
        (tmp_path / "c.txt").write_text("some text to model. " * 200)
        task_params = {"data_files": str(tmp_path / "c.txt"), "seq_len": 16}
    with pytest.raises(ValueError, match=match):
        train(tiny(), config(task=task, task_params=task_params, extrapolate=(params,)))
