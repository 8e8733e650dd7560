"""Synthetic proxy tasks: oracles re-derive every label from the inputs alone."""
import itertools
import math
import time

import pytest
import torch

from runners.tasks import (
    IGNORE_INDEX,
    MQAR,
    Curriculum,
    PermutationWordProblem,
    StateTracking,
    Task,
    make_task,
    register_task,
    task_names,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def oracle_state_tracking(task: StateTracking, ids: list[int]) -> list[int]:
    """Read the table, follow the pointer through every transposition, answer at each ASK."""
    assert ids[0] == task.bos_id
    sep = ids.index(task.sep_id)
    table = dict(zip(ids[1:sep:2], ids[2:sep:2]))
    assert sorted(table) == list(range(task.m))
    assert set(table.values()) <= {task.bit0_id, task.bit1_id}
    labels = [IGNORE_INDEX] * len(ids)
    ptr = ids[sep + 1]
    for t in range(sep + 2, len(ids), 3):
        x, y, ask = ids[t : t + 3]
        assert ask == task.ask_id and x != y
        ptr = y if ptr == x else x if ptr == y else ptr
        labels[t + 2] = table[ptr]
    return labels


def oracle_mqar(task: MQAR, ids: list[int]) -> list[int]:
    """Every key-half token after the pairs is a query; its label is the paired value."""
    ctx = 2 * task.num_kv_pairs
    pairs = dict(zip(ids[0:ctx:2], ids[1:ctx:2]))
    assert len(pairs) == task.num_kv_pairs
    labels = [IGNORE_INDEX] * len(ids)
    for t in range(ctx, len(ids)):
        if ids[t] < task.num_keys:
            labels[t] = pairs[ids[t]]
    return labels


def oracle_word_problem(task: PermutationWordProblem, ids: list[int]) -> list[int]:
    """Running product in lexicographic indexing; later elements apply after earlier ones."""
    perms = list(itertools.permutations(range(task.degree)))
    state = tuple(range(task.degree))
    labels = []
    for g in ids:
        state = tuple(perms[g][state[x]] for x in range(task.degree))
        labels.append(perms.index(state))
    return labels


# (task, oracle, constant-guess token, chance level, loose bound on |acc - chance|)
CASES = {
    "state_tracking": (
        StateTracking(n=16, m=16, max_m=32),
        oracle_state_tracking,
        32 + 1,  # BIT1: answers are uniform bits, chance 0.5
        0.5,
        0.1,
    ),
    "mqar": (MQAR(vocab_size=64, seq_len=64, num_kv_pairs=8), oracle_mqar, 40, 1 / 32, 0.07),
    "s5": (PermutationWordProblem(seq_len=64), oracle_word_problem, 7, 1 / 120, 0.02),
}


@pytest.fixture(params=sorted(CASES), ids=sorted(CASES))
def case(request):
    return CASES[request.param]


def one_hot_logits(labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    logits = torch.zeros(*labels.shape, vocab_size)
    return logits.scatter(-1, labels.clamp(min=0)[..., None], 1.0)


def test_registry_names_and_protocol():
    assert set(task_names()) == {"state_tracking", "mqar", "s5", "lm"}
    for name in ("state_tracking", "mqar", "s5"):
        task = make_task(name)
        assert isinstance(task, Task) and task.name == name


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="unknown task"):
        make_task("copy")
    with pytest.raises(ValueError, match="already registered"):
        register_task("mqar")(MQAR)


def test_shapes_and_vocab_bounds(case):
    task = case[0]
    inputs, labels = task.batch(8, gen(0))
    assert inputs.shape == labels.shape == (8, task.seq_len)
    assert inputs.dtype == labels.dtype == torch.long
    assert 0 <= inputs.min() and inputs.max() < task.vocab_size
    scored = labels != IGNORE_INDEX
    assert scored.any(-1).all()
    assert 0 <= labels[scored].min() and labels[scored].max() < task.vocab_size


def test_oracle_rederives_every_label(case):
    task, oracle = case[:2]
    inputs, labels = task.batch(16, gen(1))
    for row_in, row_lab in zip(inputs.tolist(), labels.tolist()):
        assert oracle(task, row_in) == row_lab


def test_oracle_logits_score_one(case):
    task, oracle = case[:2]
    inputs, labels = task.batch(16, gen(2), split="eval")
    predicted = torch.tensor([oracle(task, row) for row in inputs.tolist()])
    assert task.metrics(one_hot_logits(predicted, task.vocab_size), labels) == {
        "acc": 1.0,
        "seq_acc": 1.0,
    }


def test_constant_guesser_scores_chance(case):
    task, _, token, chance, bound = case
    _, labels = task.batch(64, gen(3))
    logits = torch.zeros(*labels.shape, task.vocab_size)
    logits[..., token] = 1.0
    scores = task.metrics(logits, labels)
    assert abs(scores["acc"] - chance) < bound
    assert scores["seq_acc"] < 0.1


def test_same_seed_same_batch_and_splits_differ(case):
    task = case[0]
    a_in, a_lab = task.batch(4, gen(7))
    b_in, b_lab = task.batch(4, gen(7))
    assert torch.equal(a_in, b_in) and torch.equal(a_lab, b_lab)
    assert not torch.equal(a_in, task.batch(4, gen(8))[0])
    eval_in = task.batch(4, gen(7), split="eval")[0]
    assert torch.equal(eval_in, task.batch(4, gen(7), split="eval")[0])
    assert not torch.equal(a_in, eval_in)


def test_successive_eval_batches_differ_and_never_repeat_train(case):
    task = case[0]
    g_train, g_eval = gen(11), gen(11)
    train = {tuple(row) for _ in range(8) for row in task.batch(4, g_train)[0].tolist()}
    evals = [task.batch(4, g_eval, split="eval")[0] for _ in range(8)]
    assert not torch.equal(evals[0], evals[1])
    assert not train & {tuple(row) for batch in evals for row in batch.tolist()}


def test_unknown_split_raises(case):
    with pytest.raises(ValueError, match="split"):
        case[0].batch(2, gen(0), split="test")


@pytest.mark.parametrize(
    "name, params",
    [
        ("state_tracking", dict(n=102, m=102)),
        ("mqar", dict(seq_len=512, num_kv_pairs=64)),
        ("s5", dict(seq_len=512)),
    ],
    ids=["state_tracking-T513", "mqar-T512", "s5-T512"],
)
def test_generation_is_fast(name, params):
    task = make_task(name, **params)
    start = time.perf_counter()
    task.batch(256, gen(0))
    assert task.seq_len >= 512
    assert time.perf_counter() - start < 1.0


# ---- state tracking specifics


def test_state_tracking_pointer_moves_and_stale_pointer_is_near_chance():
    task = StateTracking(n=32, m=16, max_m=16)
    inputs, labels = task.batch(64, gen(4))
    moves, stale_hits, answers = 0, 0, 0
    for row, lab in zip(inputs.tolist(), labels.tolist()):
        sep = row.index(task.sep_id)
        table = dict(zip(row[1:sep:2], row[2:sep:2]))
        start = ptr = row[sep + 1]
        for t in range(sep + 2, len(row), 3):
            x, y = row[t : t + 2]
            new = y if ptr == x else x if ptr == y else ptr
            moves += new != ptr
            ptr = new
            stale_hits += table[start] == lab[t + 2]
            answers += 1
    # touch_prob 0.5 plus the 2/m chance that a free transposition hits the pointer.
    assert abs(moves / answers - (0.5 + 0.5 * 2 / 16)) < 0.05
    assert stale_hits / answers < 0.65


def test_state_tracking_layout():
    task = StateTracking(n=5, m=4, max_m=8)
    assert task.seq_len == 3 + 2 * 4 + 3 * 5 and task.vocab_size == 8 + 5
    inputs, labels = task.batch(3, gen(0))
    scored = (labels != IGNORE_INDEX).nonzero()[:, 1].view(3, 5)
    assert (inputs.gather(1, scored) == task.ask_id).all()
    assert ((inputs == task.ask_id).sum(-1) == 5).all()


@pytest.mark.parametrize("params", [dict(n=0), dict(m=1), dict(m=9, max_m=8), dict(touch_prob=1.5)])
def test_state_tracking_rejects_bad_params(params):
    with pytest.raises(ValueError):
        StateTracking(**params)


# ---- curriculum


def test_curriculum_promotes_at_threshold_and_tracks_stages():
    cur = Curriculum()
    assert (cur.n, cur.n_max, cur.done) == (8, 0, False)
    assert cur.promote(0.5) is False and cur.n == 8
    assert cur.promote(0.95) is True
    assert (cur.n, cur.n_max) == (16, 8)
    assert cur.promote(0.899) is False
    assert cur.promote(0.7) is False
    assert cur.promote(0.90) is True
    assert cur.stage_acc == {8: 0.95, 16: 0.90}
    assert cur.promote(0.3) is False
    assert cur.summary() == {"n_max": 16, "stage_acc": {8: 0.95, 16: 0.90, 32: 0.3}}


def test_curriculum_runs_to_the_end():
    cur = Curriculum()
    for _ in range(6):
        assert cur.promote(1.0)
    assert cur.done and cur.n_max == 256
    with pytest.raises(RuntimeError):
        cur.promote(1.0)


def test_curriculum_tasks_share_one_vocabulary():
    cur = Curriculum(stages=(8, 16, 32))
    first = cur.task()
    assert (first.n, first.m) == (8, 8)
    cur.promote(0.99)
    second = cur.task(touch_prob=0.25)
    assert (second.n, second.m, second.touch_prob) == (16, 16, 0.25)
    assert first.vocab_size == second.vocab_size == 32 + 5


@pytest.mark.parametrize("params", [dict(stages=()), dict(stages=(16, 8)), dict(threshold=0.0)])
def test_curriculum_rejects_bad_params(params):
    with pytest.raises(ValueError):
        Curriculum(**params)


def test_curriculum_rejects_bad_accuracy():
    with pytest.raises(ValueError):
        Curriculum().promote(90.0)


# ---- mqar specifics


def test_mqar_queries_every_key_once():
    task = MQAR(vocab_size=128, seq_len=96, num_kv_pairs=12)
    inputs, _ = task.batch(16, gen(5))
    ctx = 2 * task.num_kv_pairs
    for row in inputs.tolist():
        queried = [t for t in row[ctx:] if t < task.num_keys]
        assert sorted(queried) == sorted(row[0:ctx:2])
        assert all(v >= task.num_keys for v in row[1:ctx:2])


def test_mqar_power_law_places_queries_earlier_than_uniform():
    def mean_query_offset(power_a: float) -> float:
        task = MQAR(vocab_size=256, seq_len=256, num_kv_pairs=8, power_a=power_a)
        _, labels = task.batch(64, gen(6))
        return (labels != IGNORE_INDEX).nonzero()[:, 1].float().mean().item() - 16

    uniform, power_law = mean_query_offset(1.0), mean_query_offset(0.01)
    assert abs(uniform - (256 - 16) / 2) < 15
    assert power_law < 0.6 * uniform


@pytest.mark.parametrize(
    "params",
    [
        dict(num_kv_pairs=0),
        dict(vocab_size=16, num_kv_pairs=9),
        dict(seq_len=63, num_kv_pairs=16),
        dict(power_a=0.0),
    ],
)
def test_mqar_rejects_bad_params(params):
    with pytest.raises(ValueError):
        MQAR(**params)


# ---- word problem specifics


def test_word_problem_vocab_and_degree():
    assert PermutationWordProblem().vocab_size == 120
    s3 = PermutationWordProblem(seq_len=33, degree=3)
    inputs, labels = s3.batch(8, gen(9))
    assert s3.vocab_size == math.factorial(3)
    for row_in, row_lab in zip(inputs.tolist(), labels.tolist()):
        assert oracle_word_problem(s3, row_in) == row_lab
    with pytest.raises(ValueError):
        PermutationWordProblem(degree=7)
