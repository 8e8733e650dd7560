"""The proxy trainer: determinism, resume, learning, NaN, elastic depth, curriculum, LM end
to end, the CLI. Its golden curves are in test_golden.py."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nas import loads_arch
from nas.cost import projection_flops
from runners.elastic import loop_groups, projection_compute
from runners.train import CurriculumConfig, TrainConfig, lr_at, param_groups, train, with_vocab

from helpers import REPO, arch

ROOT = REPO
MQAR = {"vocab_size": 32, "seq_len": 32, "num_kv_pairs": 4}


def config(**kw) -> TrainConfig:
    base = dict(task="mqar", task_params=MQAR, steps=6, batch_size=8, warmup_steps=2,
                eval_every=3, eval_batches=2, progress=False)
    return TrainConfig(**{**base, **kw})


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread


# ---------------------------------------------------------------- determinism, resume


def test_same_seed_same_losses_and_different_seed_differs():
    a = train(arch("tiny_noloop"), config(steps=4, seed=3))
    b = train(arch("tiny_noloop"), config(steps=4, seed=3))
    c = train(arch("tiny_noloop"), config(steps=4, seed=4))
    assert a.losses == b.losses and a.final == b.final
    assert a.losses != c.losses


RANDOM_PLACEMENT = """
name: tiny_random
model: {vocab_size: 256, width: 64, defaults: {attn: {num_heads: 4}, gdn: {num_heads: 2, head_dim: 32,
        expand_v: 1}, swiglu: {hidden_size: 128}}}
num_layers: 4
hybrid: {ratio: {attn: 1, gdn: 1}, placement: random, eval_samples: 2}
"""


def elastic_early():
    elr = arch("tiny_elr")
    return elr.model_copy(update={"elastic": elr.elastic.model_copy(update={"switch_at": 0.25})})


@pytest.mark.parametrize("make", [elastic_early, lambda: loads_arch(RANDOM_PLACEMENT)],
                         ids=["elastic-mixing", "random-placement"])
def test_resume_continues_exactly(tmp_path, make):
    """2N straight == N, interrupt, resume N: same losses bit for bit, with the loop-count
    sampler (elastic mixing from step 2) or torch's RNG (random placement) in use on both
    sides of the checkpoint."""
    spec = make()
    cfg = config(task_params={"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2}, steps=6,
                 batch_size=4, eval_every=3, checkpoint_every=3)
    straight = train(spec, cfg, out_dir=tmp_path / "a")
    first = train(spec, cfg, out_dir=tmp_path / "b", callback=lambda step, m: step < 3)
    assert first.status == "stopped" and first.steps == 3
    resumed = train(spec, cfg, out_dir=tmp_path / "b", resume=tmp_path / "b" / "checkpoint.pt")
    assert resumed.status == "ok" and resumed.steps == 6
    assert resumed.losses == straight.losses
    assert resumed.final == straight.final
    assert resumed.depth_rows == straight.depth_rows
    assert [p.quality for p in resumed.elastic] == [p.quality for p in straight.elastic]
    assert json.loads((tmp_path / "b" / "result.json").read_text())["steps"] == 6
    with pytest.raises(ValueError, match="different arch or config"):
        train(spec, cfg.model_copy(update={"lr": 1e-3}), resume=tmp_path / "b" / "checkpoint.pt")


# ---------------------------------------------------------------- learning, failure


def test_gdn_learns_mqar_well_above_chance():
    """Chance is 1 / (vocab / 2) = 1/16 per query; ~0.87 is reached in 100 steps."""
    task = {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}
    result = train(arch("tiny_noloop"), config(task_params=task, steps=100, batch_size=64, lr=3e-3,
                                               warmup_steps=10, eval_every=50, eval_batches=4))
    assert result.status == "ok"
    assert result.quality_metric == "acc" and result.higher_is_better
    assert result.quality > 8 / 16, result.final


def test_nan_loss_returns_failed_result():
    result = train(arch("tiny_noloop"), config(steps=10, lr=1e6, min_lr=0, warmup_steps=0))
    assert result.status == "failed"
    assert "non-finite" in result.reason
    assert result.steps < 10 and all(math.isfinite(x) for x in result.losses)


def test_callback_stops_and_sees_metrics():
    seen = []
    result = train(arch("tiny_noloop"), config(steps=9, eval_every=3),
                   callback=lambda step, m: seen.append((step, m)) or step < 6)
    assert [s for s, _ in seen] == [3, 6]
    assert {"eval_loss", "acc"} <= set(seen[0][1])
    assert result.status == "stopped" and result.steps == 6


# ---------------------------------------------------------------- elastic depth


def test_elastic_points_and_one_loop_costs_the_plain_model():
    elr = arch("tiny_elr")
    result = train(elr, config(task_params={"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2},
                               steps=4, batch_size=8))
    assert result.status == "ok"
    assert [p.k for p in result.elastic] == [1, 2, 3, 4]
    # mixing only from switch_at = 0.75: steps 0-2 at one loop (ELR), step 3 mixed
    assert "T" not in result.depth_rows and result.switch_step == 3
    assert result.depth_rows["1"] >= 3 * 8 and sum(result.depth_rows.values()) == 4 * 8
    proxy = result.arch
    plain = proxy.model_copy(update={"loops": (), "elastic": None})
    assert result.elastic[0].compute == projection_flops(plain).total
    computes = [p.compute for p in result.elastic]
    assert computes == sorted(set(computes)), "each extra loop costs more"
    assert all(0 <= p.quality <= 1 and p.quality == p.metrics["acc"] for p in result.elastic)


def test_loop_groups_partition_the_batch():
    dist = arch("tiny_elr").elastic.train
    groups = loop_groups(dist, 64, torch.Generator().manual_seed(0))
    assert {k for k, _ in groups} == {1, 2, 3, 4}
    rows = torch.cat([r for _, r in groups]).sort().values
    assert torch.equal(rows, torch.arange(64))
    assert loop_groups(None, 8, torch.Generator()) == [(None, None)]


@pytest.mark.parametrize("per", ["step", "micro_batch"])
def test_loop_count_drawn_per_step_or_micro_batch(per):
    """``per: step``: every micro-batch of an optimizer step runs the one count drawn for
    the step; ``per: micro_batch``: a count per micro-batch, so a step mixes counts."""
    import yaml
    spec = yaml.safe_load((ROOT / "spaces" / "archs" / "tiny_elr.yaml").read_text())
    spec["elastic"] = {**spec["elastic"], "switch_at": 0.0,
                       "train": {"kind": "uniform", "low": 1, "high": 3, "per": per}}
    seen: list[list[int]] = []
    import runners.train as trainer
    groups = trainer.loop_groups

    def spy(dist, batch_size, generator):
        out = groups(dist, batch_size, generator)
        seen.append([k for k, _ in out])
        return out

    trainer.loop_groups = spy
    try:
        result = train(loads_arch(yaml.safe_dump(spec)),
                       config(task_params={"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2},
                              steps=6, batch_size=4, grad_accum=3, eval_every=6))
    finally:
        trainer.loop_groups = groups
    assert result.status == "ok" and len(seen) == 6 * 3
    assert all(len(ks) == 1 for ks in seen)  # one count for the whole micro-batch either way
    steps = [{ks[0] for ks in seen[i:i + 3]} for i in range(0, len(seen), 3)]
    if per == "step":
        assert all(len(s) == 1 for s in steps)
        assert len(set().union(*steps)) > 1, "different steps draw different counts"
    else:
        assert any(len(s) > 1 for s in steps), "micro-batches of one step draw their own counts"
    assert sum(result.depth_rows.values()) == 6 * 3 * 4


def test_random_placement_per_step_holds_one_pattern_for_the_whole_step():
    """``hybrid.sampling_per: step``: the trainer draws the step's pattern before its
    micro-batches (LoopLM.start_step), so all grad_accum micro-batches run the same one."""
    from builders.model import LoopLM
    spec = """
name: rnd
model: {vocab_size: 64, width: 32, defaults: {attn: {num_heads: 2}, gdn: {num_heads: 2, head_dim: 16, expand_v: 1}, swiglu: {hidden_size: 64}}}
num_layers: 4
hybrid: {ratio: {attn: 1, gdn: 1}, placement: random, sampling_per: step}
"""
    drawn, start = [], LoopLM.start_step

    def spy(self, generator=None):
        pattern = start(self, generator)
        drawn.append(tuple(pattern))
        return pattern

    LoopLM.start_step = spy
    try:
        result = train(loads_arch(spec), config(steps=5, batch_size=4, grad_accum=3, eval_every=5))
    finally:
        LoopLM.start_step = start
    assert result.status == "ok" and len(drawn) == 5  # one draw per optimizer step
    assert all(sorted(p) == [0, 0, 1, 1] for p in drawn) and len(set(drawn)) > 1


# ---------------------------------------------------------------- curriculum, LM, config


def test_state_tracking_curriculum_promotes_and_stops():
    model = arch("tiny_noloop")
    def run(threshold):
        stages = CurriculumConfig(stages=(4, 6), threshold=threshold, stage_steps=4)
        return train(model, config(task="state_tracking", task_params={}, steps=None, eval_every=2,
                                   curriculum=stages))

    easy = run(threshold=0.05)
    assert easy.status == "ok" and easy.reason == "every curriculum stage solved"
    assert easy.quality_metric == "n_max" and easy.quality == 6 and easy.higher_is_better
    assert set(easy.curriculum["stage_acc"]) == {4, 6} and easy.steps == 4
    hard = run(threshold=1.0)
    assert hard.quality == 0 and hard.steps == 4 and "unsolved" in hard.reason
    assert hard.vocab == {"spec": 256, "task": 6 + 5} and hard.arch.model.vocab_size == 11


def test_last_acc_is_higher_is_better():
    # state tracking ranks on last_acc (the answer after the last step), an accuracy
    result = train(arch("tiny_noloop"), config(task="state_tracking", task_params={"n": 4, "m": 4}, steps=2,
                                               eval_every=2))
    assert result.quality_metric == "last_acc" and result.higher_is_better


def test_lm_proxy_end_to_end(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"paragraph {i}: the quick brown fox jumps over the lazy dog "
                                f"{i * 7 % 13} times." for i in range(200)))
    task = {"data_files": str(text), "seq_len": 32}
    result = train(arch("tiny_noloop"), config(task="lm", task_params=task, steps=None,
                                               tokens=8 * 32 * 6, eval_every=3))
    assert result.status == "ok" and result.steps == 6 and result.tokens == 6 * 8 * 32
    assert result.quality_metric == "eval_loss" and not result.higher_is_better
    assert result.final["eval_loss"] < math.log(256)
    assert result.vocab is None


def test_weight_decay_groups():
    from builders.model import build_model

    model = build_model(arch("tiny_elr"), backend="torch")
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert "embed.weight" in decayed and any(n.endswith("o_proj.weight") for n in decayed)
    assert any(n.endswith("A_log") for n in kept) and any(n.endswith("dt_bias") for n in kept)
    assert all(not n.startswith("loops.") and "norm" not in n for n in decayed)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


def test_config_and_schedule():
    with pytest.raises(ValueError, match="not both"):
        config(tokens=100)
    with pytest.raises(ValueError, match="state_tracking"):
        config(curriculum=CurriculumConfig())
    with pytest.raises(ValueError, match="Extra inputs"):
        TrainConfig(steps=1, lrr=1.0)
    cfg = config(steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, 100, cfg) == pytest.approx(0.1) and lr_at(9, 100, cfg) == pytest.approx(1.0)
    assert lr_at(100, 100, cfg) == pytest.approx(0.1) and lr_at(55, 100, cfg) == pytest.approx(0.55)
    a = arch("tiny_noloop")
    assert with_vocab(a, 256) is a and with_vocab(a, 40).model.vocab_size == 40
    assert a.model.vocab_size == 256


# ---------------------------------------------------------------- CLI


def test_cli_train_json(capsys, tmp_path):
    from runners.cli import main

    sets = ["task.vocab_size=16", "task.seq_len=16", "task.num_kv_pairs=2", "batch_size=4",
            "progress=false"]
    rc = main(["train", "tiny_noloop", "--task", "mqar", "--steps", "2", "--json",
               "--out", str(tmp_path), *(arg for s in sets for arg in ("--set", s))])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "ok" and out["steps"] == 2 and len(out["losses"]) == 2
    assert (tmp_path / "result.json").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--task", "nope"], "unknown task 'nope'"),
    (["--task", "mqar", "--set", "task.bogus=1"], "bogus"),
    (["--task", "mqar", "--set", "lr=-1"], "lr"),
    (["--task", "mqar", "--steps", "2", "--tokens", "9"], "not both"),
], ids=["task", "task-param", "trainer-field", "steps-and-tokens"])
def test_cli_bad_input_exits_2(capsys, argv, message):
    from runners.cli import main

    assert main(["train", "tiny_noloop", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
