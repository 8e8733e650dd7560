"""Synthetic proxy tasks: oracles re-derive every label from the inputs alone."""
import itertools
import math
import time

import pytest
import torch

from runners.tasks import (
    IGNORE_INDEX,
    MQAR,
    ZOOLOGY_TEST,
    ZOOLOGY_TRAIN,
    Curriculum,
    PermutationWordProblem,
    StateTracking,
    Task,
    last_answer_accuracy,
    make_task,
    register_task,
    task_names,
)


pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: no thread contention


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def apply_step(task: StateTracking, step: list[int], ptr: int) -> int:
    """One step: ``x y f`` triples, disjoint pairs covering every address, swapped if f."""
    triples = [step[i : i + 3] for i in range(0, len(step), 3)]
    assert sorted(t for x, y, _ in triples for t in (x, y)) == list(range(task.m))
    for x, y, f in triples:
        assert f in (task.bit0_id, task.bit1_id)
        if f == task.bit1_id and ptr in (x, y):
            return y if ptr == x else x
    return ptr


def oracle_state_tracking(task: StateTracking, ids: list[int]) -> list[int]:
    """Read the table, follow the pointer through every step; label the pointer at each
    step's last token and its bit at each ASK."""
    assert ids[0] == task.bos_id
    sep = ids.index(task.sep_id)
    table = dict(zip(ids[1:sep:2], ids[2:sep:2]))
    assert sorted(table) == list(range(task.m))
    assert sorted(table.values()) == [task.bit0_id] * (task.m // 2) + [task.bit1_id] * (task.m // 2)
    labels = [IGNORE_INDEX] * len(ids)
    ptr = ids[sep + 1]
    width = task.step_len
    for t in range(sep + 2, len(ids), width):
        assert ids[t + width - 1] == task.ask_id
        ptr = apply_step(task, ids[t : t + width - 1], ptr)
        if task.supervise_pointer:
            labels[t + width - 2] = ptr
        labels[t + width - 1] = table[ptr]
    return labels


def oracle_mqar(task: MQAR, ids: list[int]) -> list[int]:
    """Legacy MQAR (``zoology=False``): every key-half token after the pairs is a query."""
    ctx = 2 * task.num_kv_pairs
    pairs = dict(zip(ids[0:ctx:2], ids[1:ctx:2]))
    assert len(pairs) == task.num_kv_pairs
    labels = [IGNORE_INDEX] * len(ids)
    for t in range(ctx, len(ids)):
        if ids[t] < task.num_keys:
            labels[t] = pairs[ids[t]]
    return labels


def oracle_zoology_mqar(task: MQAR, ids: list[int], labels: list[int] | None = None) -> list[int]:
    """Zoology's MQAR: a distractor may repeat a key, so the inputs alone do not say which
    occurrence is the query. What they do say: each key's query is one of its occurrences
    after the pairs. Given the scored positions, re-derive every label from the pairs.
    (With mixed settings a row's pair count is its number of queries.)"""
    scored = [t for t, y in enumerate(labels) if y != IGNORE_INDEX]
    k = len(scored)
    ctx = 2 * k
    pairs = dict(zip(ids[0:ctx:2], ids[1:ctx:2]))
    assert len(pairs) == k and len(set(pairs.values())) == k
    assert all(1 <= k < task.num_keys <= v < task.vocab_size for k, v in pairs.items())
    assert sorted(ids[t] for t in scored) == sorted(pairs) and min(scored) >= ctx
    out = [IGNORE_INDEX] * len(ids)
    for t in scored:
        out[t] = pairs[ids[t]]
    return out


def oracle_word_problem(task: PermutationWordProblem, ids: list[int]) -> list[int]:
    """Running product in lexicographic indexing; later elements apply after earlier ones."""
    perms = list(itertools.permutations(range(task.degree)))
    state = tuple(range(task.degree))
    labels = []
    for g in ids:
        state = tuple(perms[g][state[x]] for x in range(task.degree))
        labels.append(perms.index(state))
    return labels


def zoology_oracle(task, ids, labels):
    return oracle_zoology_mqar(task, ids, labels)


# (task, oracle, constant-guess token, chance level, loose bound on |acc - chance|)
CASES = {
    "state_tracking": (
        StateTracking(n=8, m=8, max_m=32),
        oracle_state_tracking,
        32 + 1,  # BIT1: answers are balanced bits, chance 0.5
        0.5,
        0.1,
    ),
    "state_tracking-m2": (StateTracking(n=6, m=2, max_m=8), oracle_state_tracking, 9, 0.5, 0.1),
    "mqar": (MQAR(vocab_size=64, seq_len=64, num_kv_pairs=8), zoology_oracle, 40, 1 / 32, 0.07),
    "mqar-legacy": (
        MQAR(vocab_size=64, seq_len=64, num_kv_pairs=8, zoology=False), oracle_mqar, 40, 1 / 32, 0.07,
    ),
    "mqar-mixed": (
        MQAR(vocab_size=64, seq_len=64, train_settings=((32, 4, 50), (64, 8, 50)),
             test_settings=((48, 6, 20), (96, 12, 20))),
        zoology_oracle, 40, 1 / 32, 0.07,
    ),
    "s5": (PermutationWordProblem(seq_len=64), oracle_word_problem, 7, 1 / 120, 0.02),
}


def rederive(task, oracle, inputs, labels):
    if oracle is zoology_oracle:
        return [oracle(task, i, y) for i, y in zip(inputs.tolist(), labels.tolist())]
    return [oracle(task, i) for i in inputs.tolist()]


@pytest.fixture(params=sorted(CASES), ids=sorted(CASES))
def case(request):
    return CASES[request.param]


def one_hot_logits(labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    logits = torch.zeros(*labels.shape, vocab_size)
    return logits.scatter(-1, labels.clamp(min=0)[..., None], 1.0)


def test_registry_names_and_protocol():
    assert set(task_names()) == {"state_tracking", "mqar", "s5", "lm", "hop_induction", "pointer_chase"}
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
    assert task.batch(8, gen(0), split="eval")[0].shape[1] >= task.seq_len
    assert inputs.dtype == labels.dtype == torch.long
    assert 0 <= inputs.min() and inputs.max() < task.vocab_size
    scored = labels != IGNORE_INDEX
    assert scored.any(-1).all()
    assert 0 <= labels[scored].min() and labels[scored].max() < task.vocab_size


def test_oracle_rederives_every_label(case):
    task, oracle = case[:2]
    for split in ("train", "eval"):
        inputs, labels = task.batch(16, gen(1), split=split)
        assert rederive(task, oracle, inputs, labels) == labels.tolist()


def test_oracle_logits_score_one(case):
    task, oracle = case[:2]
    inputs, labels = task.batch(16, gen(2), split="eval")
    predicted = torch.tensor(rederive(task, oracle, inputs, labels))
    scores = task.metrics(one_hot_logits(predicted, task.vocab_size), labels)
    assert scores["acc"] == scores["seq_acc"] == 1.0
    assert scores.get("last_acc", 1.0) == 1.0


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
        ("state_tracking", dict(n=20, m=20)),
        ("mqar", dict(seq_len=512, num_kv_pairs=64)),
        ("s5", dict(seq_len=512)),
    ],
    ids=["state_tracking-T663", "mqar-T512", "s5-T512"],
)
def test_generation_is_fast(name, params):
    task = make_task(name, **params)
    assert task.seq_len >= 512
    times = []
    for _ in range(3):  # best of three: the box is shared
        start = time.perf_counter()
        task.batch(256, gen(0))
        times.append(time.perf_counter() - start)
    assert min(times) < 1.0


# ---- state tracking specifics


def walk(task: StateTracking, row: list[int]) -> tuple[dict[int, int], list[int]]:
    """The table and the pointer's path ``p_0..p_n`` of one sequence."""
    sep = row.index(task.sep_id)
    table = dict(zip(row[1:sep:2], row[2:sep:2]))
    path, width = [row[sep + 1]], task.step_len
    for t in range(sep + 2, len(row), width):
        path.append(apply_step(task, row[t : t + width - 1], path[-1]))
    return table, path


@pytest.mark.parametrize("m", [2, 4, 16])
def test_state_tracking_pointer_moves_at_rate_one_minus_one_over_m(m):
    task = StateTracking(n=32, m=m, max_m=16)
    moves = total = 0
    for row in task.batch(64, gen(4))[0].tolist():
        path = walk(task, row)[1]
        moves += sum(a != b for a, b in zip(path, path[1:]))
        total += len(path) - 1
    assert abs(moves / total - (1 - 1 / m)) < 0.03


def test_state_tracking_m2_is_not_a_fixed_alternation():
    """Old defect: at m = 2 every step was the swap, so p_k = p_0 xor (k mod 2)."""
    task = StateTracking(n=8, m=2, max_m=2)
    hits = total = 0
    for row in task.batch(256, gen(5))[0].tolist():
        path = walk(task, row)[1]
        hits += sum(p == path[0] ^ (k % 2) for k, p in enumerate(path[1:], 1))
        total += len(path) - 1
    assert abs(hits / total - 0.5) < 0.05


def test_state_tracking_layout():
    task = StateTracking(n=5, m=4, max_m=8)
    assert task.seq_len == 3 + 2 * 4 + 5 * (3 * 4 // 2 + 1) and task.vocab_size == 8 + 5
    inputs, labels = task.batch(3, gen(0))
    bits = (labels >= task.bit0_id).nonzero()[:, 1].view(3, 5)
    assert (inputs.gather(1, bits) == task.ask_id).all()
    assert ((inputs == task.ask_id).sum(-1) == 5).all()
    assert bits[0, -1] == task.seq_len - 1
    pointers = ((labels != IGNORE_INDEX) & (labels < task.bit0_id)).nonzero()[:, 1].view(3, 5)
    assert torch.equal(pointers, bits - 1)
    plain = StateTracking(n=5, m=4, max_m=8, supervise_pointer=False)
    assert torch.equal(plain.batch(3, gen(0))[0], inputs)  # the same inputs either way
    assert ((plain.batch(3, gen(0))[1] != IGNORE_INDEX).sum(-1) == 5).all()


def test_pointer_labels_are_scored_apart():
    task = StateTracking(n=6, m=4, max_m=8)
    inputs, labels = task.batch(16, gen(3))
    truth = torch.tensor([oracle_state_tracking(task, row) for row in inputs.tolist()])
    wrong_ptr = truth.masked_fill((truth >= 0) & (truth < task.bit0_id), task.ask_id)
    scores = task.metrics(one_hot_logits(wrong_ptr, task.vocab_size), labels)
    assert scores["acc"] == scores["last_acc"] == 1.0 and scores["ptr_acc"] == 0.0


def test_last_answer_accuracy_scores_only_the_final_answer():
    task = StateTracking(n=10, m=4, max_m=8, supervise_pointer=False)
    inputs, labels = task.batch(32, gen(6))
    truth = torch.tensor([oracle_state_tracking(task, row) for row in inputs.tolist()])
    stop = truth.clone()
    last = (labels != IGNORE_INDEX).nonzero()[:, 1].view(32, 10)[:, -1]
    flipped = 2 * task.bit0_id + 1 - truth.gather(1, last[:, None])  # the other bit
    stop.scatter_(1, last[:, None], flipped)  # right everywhere except the last answer
    scores = task.metrics(one_hot_logits(stop, task.vocab_size), labels)
    assert scores["acc"] == pytest.approx(0.9) and scores["last_acc"] == 0.0
    assert last_answer_accuracy(one_hot_logits(truth, task.vocab_size), labels) == 1.0


@pytest.mark.parametrize(
    "params, field",
    [(dict(n=0), "n"), (dict(m=1), "m"), (dict(m=9, max_m=8), "m"), (dict(m=5), "even"),
     (dict(touch_prob=0.5), "touch_prob")],
    ids=["n0", "m1", "m-over-max", "m-odd", "unknown-param"],
)
def test_state_tracking_rejects_bad_params(params, field):
    with pytest.raises(ValueError, match=field):
        make_task("state_tracking", **params)


# ---- curriculum


def test_curriculum_promotes_at_threshold_and_tracks_stages():
    cur = Curriculum()
    assert (cur.n, cur.n_max, cur.done, cur.metric) == (8, 0, False, "last_acc")
    assert cur.promote(0.5) is False and cur.n == 8
    assert cur.promote(0.95) is True
    assert (cur.n, cur.n_max) == (16, 8)
    assert cur.promote(0.899) is False
    assert cur.promote(0.7) is False
    assert cur.promote(0.90) is True
    assert cur.stage_acc == {8: 0.95, 16: 0.90}
    assert cur.promote(0.3) is False
    assert cur.summary() == {"n_max": 16, "stage_acc": {8: 0.95, 16: 0.90, 32: 0.3},
                             "metric": "last_acc"}


def test_curriculum_runs_to_the_end():
    cur = Curriculum()
    for _ in range(6):
        assert cur.promote(1.0)
    assert cur.done and cur.n_max == 256
    with pytest.raises(RuntimeError):
        cur.promote(1.0)


def test_curriculum_tasks_share_one_vocabulary():
    cur = Curriculum(stages=(2, 8, 16))
    first = cur.task()
    assert (first.n, first.m) == (2, 2)
    cur.promote(0.99)
    second = cur.task()
    assert (second.n, second.m) == (8, 8)
    assert first.vocab_size == second.vocab_size == 16 + 5


@pytest.mark.parametrize(
    "params",
    [dict(stages=()), dict(stages=(16, 8)), dict(stages=(4, 5)), dict(threshold=0.0),
     dict(metric="loss")],
)
def test_curriculum_rejects_bad_params(params):
    with pytest.raises(ValueError):
        Curriculum(**params)


def test_curriculum_rejects_bad_accuracy():
    with pytest.raises(ValueError):
        Curriculum().promote(90.0)


# ---- mqar specifics


def test_zoology_mqar_hand_decoded_batch():
    """vocab 16: keys are 1..7, values 8..15; 2 pairs, then 12 query-region tokens.

    Row 0 decodes as: pairs (2 -> 15), (6 -> 11); query 2 at offset 4 (answer 15), query 6
    at offset 8 (answer 11); every other token is noise from the whole vocabulary,
    including the key-like 2 at offset 13, which is unscored (Zoology's distractors).
    Row 1: pairs (1 -> 12), (3 -> 9); queries 1 at 6 (-> 12) and 3 at 10 (-> 9); noise
    holds key ids 2, 3, 4, 5, 1 at unscored offsets.
    """
    inputs, labels = MQAR(vocab_size=16, seq_len=16, num_kv_pairs=2).batch(2, gen(0))
    assert inputs.tolist() == [[2, 15, 6, 11, 2, 0, 15, 10, 6, 7, 3, 14, 11, 2, 7, 12],
                               [1, 12, 3, 9, 2, 0, 1, 4, 5, 5, 3, 8, 4, 1, 15, 4]]
    scored = {(r, t): y for (r, t), y in zip((labels != IGNORE_INDEX).nonzero().tolist(),
                                              labels[labels != IGNORE_INDEX].tolist())}
    assert scored == {(0, 4): 15, (0, 8): 11, (1, 6): 12, (1, 10): 9}


def test_zoology_mqar_distinct_values_and_whole_vocab_noise():
    task = MQAR(vocab_size=64, seq_len=128, num_kv_pairs=8)
    inputs, labels = task.batch(256, gen(5))
    ctx = 2 * task.num_kv_pairs
    values = inputs[:, 1:ctx:2]
    assert all(len(set(row)) == 8 for row in values.tolist())
    noise = inputs[:, ctx:][labels[:, ctx:] == IGNORE_INDEX]
    key_like = (noise < task.num_keys).float().mean().item()
    assert abs(key_like - 0.5) < 0.02  # the legacy variant has none
    legacy = MQAR(vocab_size=64, seq_len=128, num_kv_pairs=8, zoology=False)
    li, ll = legacy.batch(256, gen(5))
    assert (li[:, ctx:][ll[:, ctx:] == IGNORE_INDEX] >= legacy.num_keys).all()
    assert any(len(set(row)) < 8 for row in li[:, 1:ctx:2].tolist())  # values repeat


def test_mqar_chance_both_ways():
    """A constant guesser scores 1/(V/2); copying a random context value scores ~1/K."""
    task = MQAR(vocab_size=256, seq_len=64, num_kv_pairs=8)
    inputs, labels = task.batch(512, gen(12))
    g = gen(13)
    pick = torch.randint(0, 8, labels.shape, generator=g)
    copied = inputs[:, 1:16:2].gather(1, pick)  # (B, T) a random value of the context
    assert abs(task.metrics(one_hot_logits(copied, 256), labels)["acc"] - 1 / 8) < 0.02
    constant = torch.full_like(labels, 200)
    assert abs(task.metrics(one_hot_logits(constant, 256), labels)["acc"] - 1 / 128) < 0.01


def test_mqar_fixed_sets_mix_settings_and_pad():
    task = MQAR(vocab_size=64, seq_len=64, train_settings=((32, 4, 300), (64, 8, 100)),
                test_settings=((96, 12, 50),))
    x, y = task.example(7)
    assert torch.equal(x, task.example(7)[0]) and len(x) == 32
    assert not torch.equal(x, task.example(8)[0]) and len(task.example(350)[0]) == 64
    assert len(task.example(3, "eval")[0]) == 96
    inputs, labels = task.batch(400, gen(9))
    pairs = (labels != IGNORE_INDEX).sum(-1)
    assert set(pairs.tolist()) == {4, 8}
    assert abs((pairs == 4).float().mean().item() - 0.75) < 0.07  # mixed by example counts
    short = pairs == 4
    assert (inputs[short, 32:] == 0).all() and (labels[short, 32:] == IGNORE_INDEX).all()
    rows = {tuple(r) for r in inputs.tolist()}
    assert len(rows) <= 400 and len(rows) < 400  # drawn from 400 fixed examples
    assert task.batch(4, gen(9), split="eval")[0].shape == (4, 96)
    with pytest.raises(IndexError):
        task.example(400)


def test_mqar_zoology_preset():
    task = make_task("mqar", train_settings="zoology", test_settings="zoology")
    assert task.train_settings == ZOOLOGY_TRAIN and task.test_settings == ZOOLOGY_TEST
    assert task.vocab_size == 8192 and task.seq_len == 256
    inputs, labels = task.batch(8, gen(0), split="eval")
    assert inputs.shape == (8, 1024)
    assert set((labels != IGNORE_INDEX).sum(-1).tolist()) <= {s[1] for s in ZOOLOGY_TEST}


def test_mqar_legacy_queries_every_key_once():
    task = MQAR(vocab_size=128, seq_len=96, num_kv_pairs=12, zoology=False)
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
    "params, field",
    [
        (dict(num_kv_pairs=0), "num_kv_pairs"),
        (dict(vocab_size=16, num_kv_pairs=8), "num_kv_pairs"),
        (dict(seq_len=63, num_kv_pairs=16), "seq_len"),
        (dict(power_a=0.0), "power_a"),
        (dict(train_settings="zoo", test_settings="zoology"), "train_settings"),
        (dict(train_settings=((32, 4, 0),), test_settings=((32, 4, 1),)), "train_settings"),
        (dict(train_settings=((32, 4, 10),)), "together"),
        (dict(seq_len=64, train_settings=((128, 4, 10),), test_settings=((32, 4, 1),)), "seq_len"),
        (dict(vocab_size=64, train_settings=((64, 4, 1),), test_settings=((256, 40, 1),)),
         "test_settings"),
    ],
)
def test_mqar_rejects_bad_params(params, field):
    with pytest.raises(ValueError, match=field):
        make_task("mqar", **params)


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
