"""The Trainer's parts one at a time: a step trains and returns its loss, an evaluation
leaves the model and the training RNG alone, and the checkpoint state (TrainState) goes to
disk and back, in the dict every earlier trainer wrote, so an old run resumes."""
from __future__ import annotations

import pytest
import torch

from helpers import arch
from runners.checkpoint import (CHECKPOINT, CheckpointError, TrainState, fingerprint, load, load_state, save,
                                save_state)
from runners.elastic import switched_at, trained_loops
from runners.train import CurriculumConfig, TrainConfig, Trainer, train

pytestmark = pytest.mark.usefixtures("one_thread")
MQAR = {"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2}
# the keys a checkpoint held before TrainState existed: readers (train --resume, diagnose,
# export, a sweep's serving measurement, the supernet) index this dict
OLD_KEYS = {"fingerprint", "step", "arch", "config", "stage_start", "tokens", "losses", "depth_rows", "evals",
            "model", "optimizer", "rng", "curriculum"}


def config(**kw) -> TrainConfig:
    base = dict(task="mqar", task_params=MQAR, steps=6, batch_size=4, warmup_steps=2, eval_every=3,
                eval_batches=1, progress=False)
    return TrainConfig(**{**base, **kw})


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_train_step_changes_the_weights_and_returns_the_loss():
    trainer = Trainer(arch("tiny_noloop"), config(grad_accum=2))
    before = weights(trainer)
    loss = trainer.train_step()
    after = weights(trainer)
    assert loss.dim() == 0 and not loss.requires_grad and 0 < loss.item() < 10
    assert trainer.step == 1 and trainer.tokens == 2 * 4 * 16 and trainer.depth_rows == {"T": 8}
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "embed.weight" in changed and len(changed) > len(before) // 2
    # the loss it returns is the one the run records, once synced
    trainer.pending.append((loss, trainer.tokens, dict(trainer.depth_rows)))
    assert trainer.sync() and trainer.losses == [loss.item()]


def test_evaluate_changes_neither_the_weights_nor_the_training_rng():
    trainer = Trainer(arch("tiny_mixerloop"), config())
    trainer.train_step()
    before, rng, data = weights(trainer), torch.get_rng_state(), trainer.data_gen.get_state()
    first = trainer.evaluate()
    assert set(first) >= {"eval_loss", "acc"} and trainer.model.training
    assert all(torch.equal(v, weights(trainer)[k]) for k, v in before.items())
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(trainer.data_gen.get_state(), data)
    assert trainer.evaluate() == first  # the same fixed batches, the same forked seed
    assert trainer.evaluate(loops=1) != first  # and ``loops`` reaches the model


def test_the_state_round_trips_and_continues_bit_for_bit(tmp_path):
    cfg = config(grad_accum=2)
    whole = Trainer(arch("tiny_elr"), cfg)
    losses = [whole.train_step() for _ in range(4)]
    half = Trainer(arch("tiny_elr"), cfg)
    for _ in range(2):
        half.train_step()
    save_state(tmp_path / CHECKPOINT, half.state())
    state = load_state(tmp_path / CHECKPOINT)
    assert isinstance(state, TrainState) and state.step == 2 and state.curriculum is None
    assert state.rng.cuda is None and torch.equal(state.rng.data, half.data_gen.get_state())
    assert state.matches(half.proxy, cfg.model_copy(update={"steps": 9, "progress": True}))
    assert not state.matches(half.proxy, cfg.model_copy(update={"seed": 1}))
    assert set(load(tmp_path / CHECKPOINT)) == OLD_KEYS  # the on-disk form is unchanged
    again = Trainer(arch("tiny_elr"), cfg)
    again.restore(state)
    assert all(torch.equal(v, half.model.state_dict()[k]) for k, v in again.model.state_dict().items())
    assert [again.train_step().item() for _ in range(2)] == [loss.item() for loss in losses[2:]]
    assert again.depth_rows == whole.depth_rows and again.tokens == whole.tokens


def test_a_checkpoint_as_the_old_trainer_wrote_it_resumes(tmp_path):
    """The dict train() saved before the Trainer, written key by key as it did."""
    cfg = config(checkpoint_every=3)
    whole = train(arch("tiny_noloop"), cfg)
    t = Trainer(arch("tiny_noloop"), cfg)
    t.pending = [(t.train_step(), t.tokens, dict(t.depth_rows)) for _ in range(3)]
    assert t.sync()
    t.record(t.evaluate())
    save(tmp_path / CHECKPOINT, {
        "fingerprint": fingerprint(t.proxy, cfg), "step": t.step,
        "arch": t.arch.model_dump(mode="json"), "config": cfg.model_dump(mode="json"),
        "stage_start": t.stage_start, "tokens": t.tokens, "losses": t.losses,
        "depth_rows": t.depth_rows, "evals": [e.model_dump() for e in t.evals],
        "model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "cuda": None,
                "data": t.data_gen.get_state(), "loops": t.loop_gen.get_state()},
        "curriculum": None,
    })
    resumed = train(arch("tiny_noloop"), cfg, out_dir=tmp_path, resume=tmp_path / CHECKPOINT)
    assert resumed.losses == whole.losses and resumed.evals == whole.evals and resumed.final == whole.final


def test_a_curriculum_resumes_at_its_stage(tmp_path):
    stages = CurriculumConfig(stages=(4, 8), stage_steps=6, threshold=0.01)  # n=4 is solved at step 6
    cfg = TrainConfig(task="state_tracking", curriculum=stages, batch_size=8, eval_every=2, eval_batches=1,
                      checkpoint_every=4, progress=False)
    whole = train(arch("tiny_noloop"), cfg)
    train(arch("tiny_noloop"), cfg, out_dir=tmp_path, callback=lambda step, metrics: step < 6)
    state = load_state(tmp_path / CHECKPOINT)
    assert state.step == state.stage_start == 6 and state.curriculum is not None and state.curriculum.index == 1
    resumed = train(arch("tiny_noloop"), cfg, out_dir=tmp_path, resume=tmp_path / CHECKPOINT)
    assert resumed.model_dump(exclude={"timings", "wall_time"}) == whole.model_dump(exclude={"timings", "wall_time"})


def test_a_dict_that_is_not_a_training_checkpoint_is_one_error(tmp_path):
    save(tmp_path / CHECKPOINT, {"model": {"w": torch.zeros(2)}})  # an export's or a branch's weights
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        load_state(tmp_path / CHECKPOINT)


def test_the_elastic_schedule_the_trainer_evaluates_at():
    elr, plain = arch("tiny_elr"), arch("tiny_noloop")  # tiny_elr switches at 0.75: step 15 of 20
    assert [trained_loops(elr, s, 20) for s in (1, 15, 16, 20)] == [1, 1, None, None]
    assert trained_loops(plain, 1, 20) is None
    assert [switched_at(elr, s, 20) for s in (15, 16)] == [None, 15]
    assert switched_at(plain, 20, 20) is None
