"""ELR's late switch as the paper trains it: one loop before ``switch_at``, conditioning
entering at the switch at exactly zero, elastic points only from a run that switched,
and trainer and cost model reading one schedule (:mod:`nas.elastic`)."""
from __future__ import annotations

import pytest
import torch

from nas.cost import cost
from nas.elastic import ONE_LOOP, phases, switch_step, train_dist
from nas.spec import LoopDist
from runners.train import CurriculumConfig, TrainConfig, train

from helpers import arch

TASK = {"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2}


def config(**kw) -> TrainConfig:
    base = dict(task="mqar", task_params=TASK, steps=4, batch_size=8, warmup_steps=1,
                eval_every=2, eval_batches=1, progress=False)
    return TrainConfig(**{**base, **kw})


def with_elastic(a, **update):
    return a.model_copy(update={"elastic": a.elastic.model_copy(update=update)})


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread


def test_one_loop_before_the_switch():
    a = arch("tiny_elr")
    assert switch_step(a, 8) == 6
    assert [train_dist(a, s, 8) for s in range(8)] == [ONE_LOOP] * 6 + [a.elastic.train] * 2
    assert phases(a) == ((0.75, ONE_LOOP), (0.25, a.elastic.train))
    assert train_dist(arch("tiny_mixerloop"), 0, 8) is None


def test_conditioning_is_zero_at_the_switch_then_trains(tmp_path):
    """Before the switch the tables get no gradient (the k = 1 model is the plain one);
    from the switch on they train from exactly zero."""
    a = arch("tiny_elr")
    cfg = config(checkpoint_every=1, eval_every=1)
    result = train(a, cfg, out_dir=tmp_path)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    tables = [k for k in state if k.endswith(("index_emb", "budget_emb"))]
    assert tables, "tiny_elr is conditioned"
    assert all(state[k].abs().sum() > 0 for k in tables), "they train after the switch"
    first = train(a, cfg, out_dir=tmp_path / "b", callback=lambda step, m: step < 3)
    assert first.steps == 3 and first.switch_step is None and first.elastic == []
    before = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(before[k], torch.zeros_like(before[k])) for k in tables)
    assert first.depth_rows == {"1": 3 * 8}
    assert result.switch_step == 3 and [p.k for p in result.elastic] == [1, 2, 3, 4]


def test_curriculum_that_stops_before_the_switch_reports_no_elastic_points():
    """switch_at is a fraction of the whole multi-stage cap (8 steps: switch at 6); the
    run ends at the first unsolved stage (4 steps), so it never mixed depths."""
    stages = CurriculumConfig(stages=(4, 6), threshold=1.0, stage_steps=4)
    result = train(arch("tiny_elr"), config(task="state_tracking", task_params={}, steps=None,
                                            curriculum=stages))
    assert result.steps == 4 and "unsolved" in result.reason
    assert result.switch_step is None and result.elastic == []
    assert set(result.depth_rows) == {"1"}


def test_trainer_runs_what_the_cost_model_prices():
    """A one-value train distribution makes the run deterministic: the forward FLOPs per
    training token the trainer ran (rows per loop count) equal cost()'s figure."""
    a = with_elastic(arch("tiny_elr"), train=LoopDist(values=(3,), weights=(1.0,)), switch_at=0.5)
    result = train(a, config(steps=4))
    sheet = cost(result.arch)
    rows = result.depth_rows
    assert rows == {"1": 2 * 8, "3": 2 * 8}
    ran = sum(n * sheet.at(int(k)).forward_flops if int(k) in a.elastic.eval else
              n * cost(result.arch.model_copy(update={"elastic": None, "loops": tuple(
                  r.model_copy(update={"T": int(k)}) for r in result.arch.loops)})).figures.forward_flops
              for k, n in rows.items()) / sum(rows.values())
    assert 3 * ran == pytest.approx(sheet.train_flops_per_token, rel=1e-12)


def test_elr_hybrid_training_compute_next_to_the_paper():
    """ELR estimates its late switch at about 1.16× the baseline's training compute. With
    one loop before switch_at = 0.75 (then k ∈ 1..4 at 32.5/22.5/22.5/22.5%), elr_hybrid
    trains at 1.136× its no-loop twin; running T = 4 before the switch would be 2.04×."""
    a = arch("elr_hybrid")
    twin = a.model_copy(update={"loops": (), "elastic": None})
    ratio = cost(a).train_flops_per_token / cost(twin).train_flops_per_token
    assert ratio == pytest.approx(1.1357, abs=5e-4)
    assert abs(ratio - 1.16) < 0.03
