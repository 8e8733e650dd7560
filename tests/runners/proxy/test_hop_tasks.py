"""k-hop induction and pointer chasing: labels re-derived by brute force from each prefix,
no answer leaks, deterministic splits, and the exact accuracy of shallow predictors.

The shallow predictors are the shortcut audit of ``tests/runners/proxy/test_task_shortcuts.py`` for these
tasks, at ``k = 3``: a lookup table on the last ``w`` input tokens (``hop_induction``,
``n = 32``; Monte Carlo, plug-in and held-out estimates bracketing the truth) and the
Bayes-optimal predictor that sees the last ``w`` tokens and its position (``pointer_chase``,
``N = 8``; exact, by enumerating every cycle). The numbers are stated in each task's
docstring; ``python tests/runners/proxy/test_hop_tasks.py`` prints them.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from nas import load_arch
from runners.tasks import IGNORE_INDEX, HopInduction, PointerChase, Task, make_task
from runners.tasks import hop_induction, pointer_chase
from runners.tasks.hop_induction import hop_indices
from runners.train import TrainConfig, train
from helpers import REPO

pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: no thread contention

HOP_WINDOW_ACC = {1: 0.295, 2: 0.355, 4: 0.452, 8: 0.691}  # k=3, n=32, A=4
CHASE_WINDOW_ACC = {1: 0.143, 2: 0.143, 4: 0.149, 8: 0.187}  # k=3, N=8, Q=8


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- brute-force decoders


def brute_hop(x: list[int], i: int, k: int) -> int | None:
    """``hop^k(i)`` by the definition: one past the last earlier occurrence, k times."""
    for _ in range(k):
        earlier = [j for j in range(i) if x[j] == x[i]]
        if not earlier:
            return None
        i = earlier[-1] + 1
    return i


def decode_hop(task: HopInduction, ids: list[int]) -> list[int]:
    """Every label from the inputs, the label at ``t`` from ``ids[: t + 1]`` alone."""
    k = ids[0] - task.alphabet_size + 1
    assert k in task.ks
    labels = [ids[0] if len(task.ks) > 1 else IGNORE_INDEX]
    for t in range(1, len(ids)):
        letters = ids[1 : t + 1]  # what the logits at t have seen, less the hop token
        j = brute_hop(letters, t - 1, k)
        labels.append(IGNORE_INDEX if j is None else letters[j])
    return labels


def decode_chase(task: PointerChase, ids: list[int]) -> list[int]:
    N = task.num_nodes
    k = ids[0] - N + 1
    assert k in task.ks
    labels = [ids[0] if len(task.ks) > 1 else IGNORE_INDEX] + [IGNORE_INDEX] * (2 * N)
    for t in range(1 + 2 * N, len(ids)):
        seen = ids[: t + 1]
        successor = dict(zip(seen[1 : 1 + 2 * N : 2], seen[2 : 2 + 2 * N : 2]))
        node = seen[t]
        for _ in range(k):
            node = successor[node]
        labels.append(node)
    return labels


CASES = {
    "hop-k3": (HopInduction(n=24, k=3), decode_hop),
    "hop-mixed-A5": (HopInduction(n=20, k="mixed", alphabet_size=5), decode_hop),
    "hop-k13": (HopInduction(n=16, k=[1, 3]), decode_hop),
    "chase-k3": (PointerChase(), decode_chase),
    "chase-mixed": (PointerChase(num_nodes=6, num_queries=4, k="mixed", max_k=5), decode_chase),
}


@pytest.fixture(params=sorted(CASES), ids=sorted(CASES))
def case(request):
    return CASES[request.param]


def one_hot(labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.zeros(*labels.shape, vocab_size).scatter(-1, labels.clamp(min=0)[..., None], 1.0)


# ---------------------------------------------------------------- format and labels


def test_hand_decoded_hops():
    """x = a b a c b a b c: hop^k worked out by hand, and by the brute force."""
    x = [0, 1, 0, 2, 1, 0, 1, 2]
    by_hand = {1: [-1, -1, 1, -1, 2, 3, 5, 4],
               2: [-1, -1, -1, -1, 1, -1, 3, 2],
               3: [-1, -1, -1, -1, -1, -1, -1, 1]}
    for k, expected in by_hand.items():
        got = hop_indices(torch.tensor([x]), torch.tensor([k]))[0].tolist()
        assert got == expected
        assert [brute_hop(x, i, k) or -1 for i in range(8)] == expected
    rows = hop_indices(torch.tensor([x] * 3), torch.tensor([1, 2, 3]))  # one k per row
    assert rows.tolist() == list(by_hand.values())


def test_registered_and_protocol():
    for name in ("hop_induction", "pointer_chase"):
        task = make_task(name)
        assert isinstance(task, Task) and task.name == name
    assert make_task("hop_induction", n=8, k=[2, 1]).ks == (1, 2)  # a YAML list
    assert make_task("pointer_chase", k="mixed").ks == (1, 2, 3, 4)


def test_shapes_vocab_and_layout(case):
    task = case[0]
    inputs, labels = task.batch(16, gen(0))
    assert inputs.shape == labels.shape == (16, task.seq_len)
    assert 0 <= inputs.min() and inputs.max() < task.vocab_size
    scored = labels != IGNORE_INDEX
    assert 0 <= labels[scored].min() and labels[scored].max() < task.vocab_size
    body = inputs[:, 1:]
    first_special = getattr(task, "alphabet_size", getattr(task, "num_nodes", None))
    assert (body < first_special).all() and (inputs[:, 0] >= first_special).all()
    if isinstance(task, HopInduction):
        assert (body[:, 1:] != body[:, :-1]).all()  # no two equal neighbours


def test_brute_force_rederives_every_label_from_its_prefix(case):
    """The decoders read only ``ids[: t + 1]`` for the label at ``t``: labels are causal."""
    task, decode = case
    for split in ("train", "eval"):
        inputs, labels = task.batch(32, gen(1), split=split)
        assert [decode(task, ids) for ids in inputs.tolist()] == labels.tolist()


def test_labels_do_not_depend_on_later_letters():
    """Rewriting the string after letter i leaves every label up to i unchanged."""
    x = hop_induction.no_repeat_string(64, 32, 4, gen(2))
    k = torch.full((64,), 3)
    y = hop_indices(x, k)
    for i in (5, 17, 30):
        tail = hop_induction.no_repeat_string(64, 31 - i, 4, gen(i))
        clash = tail[:, :1] == x[:, i : i + 1]
        tail = torch.where(clash, (tail + 1) % 4, tail)  # renamed: still no repeats, != x_i
        changed = torch.cat([x[:, : i + 1], tail], 1)
        assert (changed[:, 1:] != changed[:, :-1]).all() and not torch.equal(changed, x)
        assert torch.equal(hop_indices(changed, k)[:, : i + 1], y[:, : i + 1])


def test_pointer_answers_are_never_written():
    """An answer is never its own query, and the queries before it hold it exactly as often
    as queries drawn independently of ``σ`` would (``j / (N - 1)`` at query ``j``)."""
    task = PointerChase(num_nodes=8, num_queries=8)
    B, N = 4096, task.num_nodes
    inputs, labels = task.batch(B, gen(3))
    queries, answers = inputs[:, 1 + 2 * N :], labels[:, 1 + 2 * N :]
    assert (queries != answers).all()
    for j in (1, 3, 5):
        rate = (queries[:, :j] == answers[:, j : j + 1]).any(1).float().mean().item()
        expected = j / (N - 1)
        assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / B), j


def test_pointer_pairs_are_one_cycle():
    task = PointerChase(num_nodes=8)
    inputs, _ = task.batch(64, gen(4))
    for ids in inputs.tolist():
        succ = dict(zip(ids[1:17:2], ids[2:17:2]))
        assert sorted(succ) == sorted(succ.values()) == list(range(8))
        node, length = succ[0], 1
        while node != 0:
            node, length = succ[node], length + 1
        assert length == 8


def test_mixed_k_is_balanced_and_labelled_at_position_zero():
    task = HopInduction(n=16, k="mixed")
    inputs, labels = task.batch(40, gen(5))
    k = inputs[:, 0] - task.alphabet_size + 1
    assert torch.bincount(k, minlength=5)[1:].tolist() == [10, 10, 10, 10]
    assert torch.equal(labels[:, 0], inputs[:, 0])
    fixed = HopInduction(n=16, k=2)
    assert (fixed.batch(8, gen(5))[1][:, 0] == IGNORE_INDEX).all()


def test_metrics_score_letters_only_and_split_by_k(case):
    """Right everywhere but position 0 scores 1; right only on rows of the smallest k gives
    acc_k = 1 there and 0 elsewhere (every label is wrong by a shift of one id)."""
    task, _ = case
    inputs, labels = task.batch(24, gen(6), split="eval")
    perfect = one_hot(labels, task.vocab_size)
    perfect[:, 0] = one_hot(torch.zeros_like(labels[:, 0]), task.vocab_size)  # wrong at 0
    scores = task.metrics(perfect, labels)
    assert scores["acc"] == scores["seq_acc"] == 1.0
    if len(task.ks) == 1:
        assert not any(key.startswith("acc_k") for key in scores)
        return
    first = getattr(task, "alphabet_size", getattr(task, "num_nodes", None))
    row_k = inputs[:, 0] - first + 1
    wrong = torch.where(labels >= 0, (labels + 1) % first, labels)
    guess = torch.where((row_k == min(task.ks))[:, None], labels, wrong)
    scores = task.metrics(one_hot(guess, task.vocab_size), labels)
    assert scores[f"acc_k{min(task.ks)}"] == 1.0
    assert all(scores[f"acc_k{k}"] == 0.0 for k in task.ks if k != min(task.ks))
    assert set(scores) == {"acc", "seq_acc", *(f"acc_k{k}" for k in task.ks)}


def test_same_seed_same_batch_and_splits_differ(case):
    task = case[0]
    for split in ("train", "eval"):
        a, b = task.batch(8, gen(7), split=split), task.batch(8, gen(7), split=split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    train, evals = task.batch(64, gen(7))[0], task.batch(64, gen(7), split="eval")[0]
    assert not torch.equal(train, evals)
    shared = {tuple(r) for r in train.tolist()} & {tuple(r) for r in evals.tolist()}
    assert len(shared) <= 1  # whole sequences coinciding: only by chance, and rarely
    g = gen(8)
    assert not torch.equal(task.batch(8, g, split="eval")[0], task.batch(8, g, split="eval")[0])


@pytest.mark.parametrize("params, field", [
    ({"n": 1}, "n"), ({"alphabet_size": 2}, "alphabet_size"), ({"k": 5}, "k"),
    ({"k": "all"}, "k"), ({"k": [0, 2]}, "k"), ({"max_k": 0}, "max_k"),
])
def test_hop_rejects_bad_params(params, field):
    with pytest.raises(ValueError, match=field):
        HopInduction(**params)


@pytest.mark.parametrize("params, field", [
    ({"num_nodes": 4}, "num_nodes"), ({"num_queries": 9}, "num_queries"),
    ({"num_queries": 0}, "num_queries"), ({"k": 6}, "k"),
])
def test_chase_rejects_bad_params(params, field):
    with pytest.raises(ValueError, match=field):
        PointerChase(**params)


@pytest.mark.parametrize("name, params", [
    ("hop_induction", {"n": 12, "k": "mixed"}), ("pointer_chase", {"num_nodes": 6, "k": [1, 2]}),
])
def test_trainer_reports_accuracy_per_k(name, params):
    """The trainer averages metrics over eval batches: every acc_k is present in each."""
    arch = load_arch(REPO / "spaces" / "archs" / "tiny_noloop.yaml")
    config = TrainConfig(task=name, task_params=params, steps=2, batch_size=8, eval_batches=2,
                         progress=False)
    final = train(arch, config).final
    ks = make_task(name, **params).ks
    assert {f"acc_k{k}" for k in ks} <= set(final)
    assert all(0.0 <= final[f"acc_k{k}"] <= 1.0 for k in ks)


# ---------------------------------------------------------------- shallow predictors


def window_keys(inputs: torch.Tensor, w: int, base: int) -> torch.Tensor:
    """(B, T) the last ``w`` tokens at each position as one integer (left padded)."""
    B, T = inputs.shape
    padded = torch.cat([torch.full((B, w - 1), -1), inputs], 1) + 1
    key = torch.zeros(B, T, dtype=torch.long)
    for j in range(w):
        key = key * base + padded[:, j : j + T]
    return key


def lookup_table_acc(task: HopInduction, w: int, batches: list) -> tuple[float, float]:
    """(held-out, plug-in) accuracy of the best table from the last ``w`` tokens to a label:
    the held-out one (fit on one half, scored on the other, both ways) is below the
    Bayes-optimal accuracy in expectation, the plug-in one (fit and scored on all) above."""
    V = task.vocab_size
    keys, labels = [], []
    for inputs, y in batches:
        scored = y != IGNORE_INDEX
        keys.append(window_keys(inputs, w, V + 1)[scored])
        labels.append(y[scored])
    key, label = torch.cat(keys), torch.cat(labels)
    contexts, index = torch.unique(key, return_inverse=True)

    def counts(part: slice) -> torch.Tensor:  # (contexts, V)
        cells = index[part] * V + label[part]
        return torch.bincount(cells, minlength=len(contexts) * V).view(len(contexts), V)

    half = len(key) // 2
    a, b = counts(slice(None, half)), counts(slice(half, None))
    held = b.gather(1, a.argmax(1, keepdim=True)).sum() + a.gather(1, b.argmax(1, keepdim=True)).sum()
    return held.item() / len(key), (a + b).amax(1).sum().item() / len(key)


@pytest.fixture(scope="module")
def hop_batches():
    task, g = HopInduction(n=32, k=3), gen(9)
    return task, [task.batch(20_000, g) for _ in range(2)]


@pytest.mark.parametrize("w", sorted(HOP_WINDOW_ACC), ids=[f"w{w}" for w in sorted(HOP_WINDOW_ACC)])
def test_hop_window_table_accuracy_is_as_stated(hop_batches, w):
    task, batches = hop_batches
    held, plug = lookup_table_acc(task, w, batches)
    tol = 0.006  # about four standard errors at 40k sequences
    assert held - tol <= HOP_WINDOW_ACC[w] <= plug + tol, (held, plug)
    assert f"w = {w}: {HOP_WINDOW_ACC[w]:.3f}" in hop_induction.__doc__


def test_hop_constant_guesser_scores_one_over_alphabet():
    task = HopInduction(n=32, k=3)
    _, labels = task.batch(4096, gen(10))
    scored = labels != IGNORE_INDEX
    freq = torch.bincount(labels[scored], minlength=4) / scored.sum()
    assert (freq - 0.25).abs().max() < 0.01


def all_cycles(N: int) -> torch.Tensor:
    """(M, N) every N-cycle as a successor array, M = (N - 1)!."""
    rows = []
    for rest in itertools.permutations(range(1, N)):
        order = (0, *rest)
        succ = [0] * N
        for a, b in zip(order, order[1:] + order[:1]):
            succ[a] = b
        rows.append(succ)
    return torch.tensor(rows)


def power(cycles: torch.Tensor, k: int) -> torch.Tensor:
    node = torch.arange(cycles.shape[1]).expand_as(cycles)
    for _ in range(k):
        node = cycles.gather(1, node)
    return node


def pairs_in_window(task: PointerChase, j: int, w: int) -> int:
    """Complete pairs among the last ``w`` tokens at query ``j``: keys at 1 + 2i."""
    position = 1 + 2 * task.num_nodes + j
    return sum(1 for i in range(task.num_nodes) if 1 + 2 * i >= position - w + 1)


def exact_chase_acc(N: int, k: int, m: int, cycles: torch.Tensor) -> float:
    """Bayes accuracy of σ^k(q) given m of σ's pairs and q: the m keys a uniform m-subset
    (the last m of a random order), q uniform and independent, the posterior uniform over
    the cycles that agree. By symmetry σ is the cycle a -> a + 1."""
    ends = power(cycles, k)
    total = 0.0
    subsets = list(itertools.combinations(range(N), m))
    for keys in subsets:
        keys_t = torch.tensor(keys, dtype=torch.long)
        agree = (cycles[:, keys_t] == (keys_t + 1) % N).all(1)
        for q in range(N):
            total += torch.bincount(ends[agree, q], minlength=N).max().item() / agree.sum().item()
    return total / (len(subsets) * N)


def bayes_chase_acc_on_batches(task: PointerChase, w: int, inputs, labels, cycles) -> float:
    """The same predictor run on generated sequences: argmax of σ^k(q) over the cycles that
    agree with the window's pairs, scored against the real labels (ties split evenly)."""
    N, ends = task.num_nodes, power(cycles, 3)
    score, count = 0.0, 0
    for ids, y in zip(inputs.tolist(), labels.tolist()):
        for j in range(task.num_queries):
            t = 1 + 2 * N + j
            m = pairs_in_window(task, j, w)
            count += 1
            if m == 0:  # every cycle agrees: the N - 1 other nodes tie
                score += (y[t] != ids[t]) / (N - 1)
                continue
            keys, values = ids[1 + 2 * (N - m) : 1 + 2 * N : 2], ids[2 + 2 * (N - m) : 1 + 2 * N : 2]
            agree = (cycles[:, keys] == torch.tensor(values, dtype=torch.long)).all(1)
            dist = torch.bincount(ends[agree, ids[t]], minlength=N)
            best = dist == dist.max()
            score += best[y[t]].item() / best.sum().item()
    return score / count


def test_pointer_window_bayes_accuracy_is_as_stated():
    task = PointerChase(num_nodes=8, num_queries=8, k=3)
    cycles = all_cycles(8)
    by_m = {m: exact_chase_acc(8, 3, m, cycles) for m in range(4)}
    assert by_m[0] == pytest.approx(1 / 7)
    inputs, labels = task.batch(400, gen(11))
    for w, stated in CHASE_WINDOW_ACC.items():
        exact = sum(by_m[pairs_in_window(task, j, w)] for j in range(8)) / 8
        assert exact == pytest.approx(stated, abs=5e-4), w
        assert f"w = {w}: {stated:.3f}" in pointer_chase.__doc__
        measured = bayes_chase_acc_on_batches(task, w, inputs, labels, cycles)
        assert abs(measured - exact) < 4 * math.sqrt(exact * (1 - exact) / (400 * 8)), w


def report() -> None:
    task, g = HopInduction(n=32, k=3), gen(0)
    batches = [task.batch(20_000, g) for _ in range(10)]
    for w in (1, 2, 4, 8):
        held, plug = lookup_table_acc(task, w, batches)
        print(f"hop_induction k=3 n=32 w={w}: held-out {held:.4f}  plug-in {plug:.4f}")
    chase, cycles = PointerChase(), all_cycles(8)
    by_m = {m: exact_chase_acc(8, 3, m, cycles) for m in range(4)}
    for w in (1, 2, 4, 8):
        exact = sum(by_m[pairs_in_window(chase, j, w)] for j in range(8)) / 8
        print(f"pointer_chase k=3 N=8 w={w}: exact {exact:.4f}")


if __name__ == "__main__":
    report()
