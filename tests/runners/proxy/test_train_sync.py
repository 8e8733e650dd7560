"""The trainer keeps each step's loss on the device and copies losses to the host only at
evaluations, checkpoints and every ``_SYNC_EVERY`` steps; a run must not tell the
difference (the golden curve in test_golden.py pins the losses themselves)."""
from __future__ import annotations

import pytest

from helpers import arch
from runners import train as trainer
from runners.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")
MQAR = {"vocab_size": 32, "seq_len": 32, "num_kv_pairs": 4}
OUTCOME = ("status", "reason", "steps", "tokens", "losses", "depth_rows", "final", "quality")


def run(**kw):
    base = dict(task="mqar", task_params=MQAR, steps=30, batch_size=8, eval_batches=1, min_lr=0.0,
                progress=False)
    return train(arch("tiny_noloop"), TrainConfig(**{**base, **kw}))


def outcome(result, drop: tuple[str, ...] = ()) -> dict:
    return {key: getattr(result, key) for key in OUTCOME if key not in drop}


def test_a_non_finite_loss_found_late_ends_the_run_where_it_arose():
    """lr 60 with a 10-step warmup diverges at step 8: synced at every step (an evaluation
    after each) or only at the end, the run ends at the same step, with the same losses,
    tokens and rows, and names the same step (their final metrics differ: one evaluated at
    the last finite step, the other never)."""
    every_step = run(lr=60.0, warmup_steps=10, eval_every=1)
    at_the_end = run(lr=60.0, warmup_steps=10, eval_every=30)
    assert every_step.status == "failed" and 0 < every_step.steps < 29, every_step.reason
    assert f"at step {every_step.steps + 1}" in every_step.reason
    drop = ("final", "quality")
    assert outcome(at_the_end, drop) == outcome(every_step, drop)
    assert len(at_the_end.losses) == at_the_end.steps


def test_losses_are_the_same_whenever_they_are_synced(monkeypatch):
    synced_often = run(eval_every=30, steps=12)
    monkeypatch.setattr(trainer, "_SYNC_EVERY", 5)  # copies at steps 5, 10 and the end
    assert outcome(run(eval_every=30, steps=12)) == outcome(synced_often)
    monkeypatch.setattr(trainer, "_SYNC_EVERY", 1)
    assert outcome(run(eval_every=30, steps=12)) == outcome(synced_often)


def test_timings_split_the_run_into_its_phases(tmp_path):
    result = train(arch("tiny_noloop"), TrainConfig(task="mqar", task_params=MQAR, steps=4, batch_size=8,
                                                    eval_every=2, eval_batches=1, checkpoint_every=2,
                                                    progress=False),
                   out_dir=tmp_path, callback=lambda step, metrics: True)
    t = result.timings
    assert set(t) == {"build", "steps", "eval", "checkpoint", "callback"}
    assert all(v > 0 for k, v in t.items() if k != "callback") and t["callback"] >= 0
    assert sum(t.values()) <= result.wall_time
    old = result.model_dump(exclude={"timings"})  # a result.json written before timings existed reads
    assert trainer.TrainResult.model_validate(old).timings == {}
