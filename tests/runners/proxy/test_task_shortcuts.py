"""No shortcut through state tracking: predictors that do not track from the start to the
end score chance; only full tracking reaches the 0.90 promotion threshold.

Each predictor knows the bit table perfectly and is Bayes-optimal for what it sees:

* ``window(j)``: the last ``j`` steps only (``j = 1``: the current step's tokens). A
  forward filter over the pointer, from a uniform prior at the window's start, weighs
  each step by the likelihood of its tokens given the pointer and then applies it.
* ``start``: the start address only (no steps).
* ``stop(0.8)``: tracks exactly through the first 80% of the steps, then sees no more.

The likelihood of a step's tokens given the pointer comes from the generator: constant
for the current task (steps are drawn independently of the pointer), which
``test_step_tokens_carry_no_pointer_information`` checks on the token stream itself.

``OldStateTracking`` is the transposition generator this task replaced (issue 15), kept
here as a reference: the same predictors pass the threshold on it, which is the proof
that these tests can fail. ``python tests/runners/proxy/test_task_shortcuts.py`` prints the numbers.
"""
from __future__ import annotations

import pytest
import torch

from runners.tasks import IGNORE_INDEX, StateTracking

STAGES = (2, 4, 8, 16, 32, 64, 128, 256)
THRESHOLD = 0.90


pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: no thread contention


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Parsed:
    """A batch as the predictors see it: bits (B, m), start (B,), perms (B, n, m) with
    ``perms[b, k, p]`` the pointer after step k from p, the step likelihood given the
    pointer (B, n, m), and the answers (B, n) as 0/1."""

    def __init__(self, bits, start, perms, lik, answers):
        self.bits, self.start, self.perms, self.lik, self.answers = bits, start, perms, lik, answers


def parse_current(task: StateTracking, inputs: torch.Tensor, labels: torch.Tensor) -> Parsed:
    """Parse the current task's tokens: ``m/2`` triples ``x y f`` then ``ASK`` per step."""
    B, m, n = inputs.shape[0], task.m, task.n
    table = inputs[:, 1 : 1 + 2 * m].view(B, m, 2)
    bits = torch.zeros(B, m, dtype=torch.long).scatter(1, table[..., 0], table[..., 1] - task.bit0_id)
    start = inputs[:, 2 + 2 * m]
    steps = inputs[:, 3 + 2 * m :].view(B, n, task.step_len)[..., :-1].reshape(B, n, m // 2, 3)
    x, y, swap = steps[..., 0], steps[..., 1], steps[..., 2] == task.bit1_id
    perms = torch.zeros(B, n, m, dtype=torch.long)
    perms.scatter_(2, x, torch.where(swap, y, x)).scatter_(2, y, torch.where(swap, x, y))
    answers = labels[labels >= task.bit0_id].view(B, n) - task.bit0_id
    return Parsed(bits, start, perms, torch.ones(B, n, m), answers)


class OldStateTracking:
    """Reference copy of the replaced generator: step k is the transposition ``(x_k y_k)``;
    with probability ``touch_prob`` one end is the pointer, and the bits are independent."""

    def __init__(self, n: int, m: int, touch_prob: float = 0.5):
        self.n, self.m, self.touch_prob = n, m, touch_prob

    def parsed(self, B: int, g: torch.Generator) -> Parsed:
        m, n, tp = self.m, self.n, self.touch_prob
        bits = torch.randint(0, 2, (B, m), generator=g)
        torch.rand(B, m, generator=g)  # the old table order, drawn for stream parity
        ptr = start = torch.randint(0, m, (B,), generator=g)
        touch = torch.rand(B, n, generator=g) < tp
        free_end = torch.randint(0, m, (B, n), generator=g)
        offset = torch.randint(1, max(m, 2), (B, n), generator=g)
        torch.rand(B, n, generator=g)  # the written order of the two ends: not informative
        perms = torch.arange(m).repeat(B, n, 1)
        lik = torch.empty(B, n, m)
        answers = torch.empty(B, n, dtype=torch.long)
        rows = torch.arange(B)
        for k in range(n):
            x = torch.where(touch[:, k], ptr, free_end[:, k])
            y = (x + offset[:, k]) % m
            perms[rows, k, x], perms[rows, k, y] = y, x
            ends = torch.zeros(B, m).scatter(1, x[:, None], 1.0).scatter(1, y[:, None], 1.0)
            # P(written pair | pointer p): touch picks p as one end, else both ends uniform
            lik[:, k] = tp * ends / (2 * (m - 1)) + (1 - tp) / (m * (m - 1))
            ptr = perms[rows, k, ptr]
            answers[:, k] = bits[rows, ptr]
        return Parsed(bits, start, perms, lik, answers)


def current(m: int, n: int | None = None, B: int = 64, seed: int = 0) -> Parsed:
    task = StateTracking(n=n or m, m=m, max_m=max(STAGES))
    return parse_current(task, *task.batch(B, gen(seed)))


def old(m: int, n: int | None = None, B: int = 64, seed: int = 0, touch_prob: float = 0.5) -> Parsed:
    return OldStateTracking(n or m, m, touch_prob).parsed(B, gen(seed))


# ---------------------------------------------------------------- Bayes-optimal predictors


def bayes_acc(belief: torch.Tensor, bits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Per-row accuracy of the Bayes decision from a pointer belief (B, m); (B,)."""
    p1 = (belief * bits).sum(-1) / belief.sum(-1)
    guess = (p1 > 0.5).long()
    tie = (p1 - 0.5).abs() < 1e-6
    return torch.where(tie, torch.full_like(p1, 0.5), (guess == answers).float())


def push(belief: torch.Tensor, perm: torch.Tensor, lik: torch.Tensor) -> torch.Tensor:
    """Condition on a step's tokens, then apply it: the belief after the step."""
    weighted = belief * lik
    return torch.zeros_like(belief).scatter_add(1, perm, weighted)


def window_acc(data: Parsed, j: int, last_only: bool = False) -> float:
    """Knows the table and the last ``j`` steps (from a uniform prior): mean accuracy over
    the answers at steps k >= j, or over the last answer only."""
    B, n, m = data.perms.shape
    ks = [n] if last_only else range(j, n + 1)
    scores = []
    for k in ks:
        belief = torch.ones(B, m)
        for step in range(k - j, k):
            belief = push(belief, data.perms[:, step], data.lik[:, step])
            belief = belief / belief.sum(-1, keepdim=True)
        scores.append(bayes_acc(belief, data.bits, data.answers[:, k - 1]))
    return torch.stack(scores).mean().item()


def tracked_belief(data: Parsed, upto: int) -> torch.Tensor:
    """The exact pointer after ``upto`` steps, as a one-hot belief."""
    B, _, m = data.perms.shape
    ptr = data.start
    for step in range(upto):
        ptr = data.perms[torch.arange(B), step, ptr]
    return torch.zeros(B, m).scatter(1, ptr[:, None], 1.0)


def stale_acc(data: Parsed, known: int, last_only: bool) -> float:
    """Knows the pointer exactly after ``known`` steps and sees nothing after: the Bayes
    decision under the generator's marginal kernel, estimated from the pointer paths
    themselves (the pointer stays put with probability ``s`` per step, else moves
    uniformly: both generators are symmetric under relabelling the addresses)."""
    B, n, m = data.perms.shape
    path = [tracked_belief(data, k).argmax(-1) for k in range(n + 1)]
    s = torch.stack([a == b for a, b in zip(path, path[1:])]).float().mean().item()
    belief0 = tracked_belief(data, known)
    ks = [n] if last_only else range(known + 1, n + 1)
    scores = []
    for k in ks:
        keep = s ** (k - known) + (1 - s ** (k - known)) / m  # P(p_k = p_known), symmetric chain
        belief = belief0 * keep + (1 - belief0) * (1 - keep) / (m - 1)
        scores.append(bayes_acc(belief, data.bits, data.answers[:, k - 1]))
    return torch.stack(scores).mean().item()


def full_acc(data: Parsed) -> float:
    n = data.perms.shape[1]
    return torch.stack([bayes_acc(tracked_belief(data, k), data.bits, data.answers[:, k - 1])
                        for k in range(1, n + 1)]).mean().item()


def batch_size(m: int) -> int:
    return 512 if m <= 8 else 128 if m <= 64 else 16


# ---------------------------------------------------------------- the current task


@pytest.mark.parametrize("m", STAGES, ids=[f"m{m}" for m in STAGES])
def test_windowed_predictors_score_chance(m):
    data = current(m, B=batch_size(m), seed=m)
    assert full_acc(data) == 1.0
    for j in (1, 4, 8, 12):
        if j <= m:
            assert window_acc(data, j) == pytest.approx(0.5, abs=1e-4), j
            assert window_acc(data, j, last_only=True) == pytest.approx(0.5, abs=1e-4), j


@pytest.mark.parametrize("m", STAGES, ids=[f"m{m}" for m in STAGES])
def test_start_address_and_stopping_early_score_chance_on_the_last_answer(m):
    data = current(m, B=batch_size(m), seed=m + 1)
    tol = 4 / batch_size(m) ** 0.5  # four standard errors of a 0/1 mean
    assert abs(stale_acc(data, 0, last_only=True) - 0.5) < tol
    assert abs(stale_acc(data, 0, last_only=False) - 0.5) < tol
    stop = int(0.8 * m)
    assert abs(stale_acc(data, stop, last_only=True) - 0.5) < tol
    # ... while scoring every answer lets 80% tracking pass the threshold (why last_acc):
    every = (stop * 1.0 + (m - stop) * stale_acc(data, stop, last_only=False)) / m
    assert every > 0.5 + 0.8 * 0.5 - tol


def test_step_tokens_carry_no_pointer_information():
    """Checks the constant likelihood on the token stream: before a step, the pointer is
    equally likely to sit in any address slot of the step, and after it, it has moved to
    a uniform address (it stays put at rate 1/m)."""
    m, B = 8, 2048
    task = StateTracking(n=m, m=m, max_m=m)
    inputs, labels = task.batch(B, gen(3))
    data = parse_current(task, inputs, labels)
    steps = inputs[:, 3 + 2 * m :].view(B, m, task.step_len)[..., :-1].reshape(B, m, m // 2, 3)
    addresses = steps[..., :2].reshape(B, m, m)  # x_1 y_1 x_2 y_2 ...
    ptr, slot_hits, stays = data.start, torch.zeros(m), 0.0
    for k in range(m):
        slot_hits += (addresses[:, k] == ptr[:, None]).float().sum(0)
        new = data.perms[torch.arange(B), k, ptr]
        stays += (new == ptr).float().sum().item()
        ptr = new
    se = ((1 / m) * (1 - 1 / m) / (B * m)) ** 0.5
    assert ((slot_hits / (B * m)) - 1 / m).abs().max() < 4.5 * se
    assert abs(stays / (B * m) - 1 / m) < 4.5 * se


# ---------------------------------------------------------------- the old task fails them


def test_old_task_reproduces_the_audit_numbers():
    """The filter reproduces the audit's table for the old task (issue 15)."""
    assert window_acc(old(16, B=256), 8) == pytest.approx(0.93, abs=0.02)
    assert window_acc(old(64, B=64), 4) == pytest.approx(0.86, abs=0.02)


@pytest.mark.parametrize("m", [16, 64])
def test_old_task_has_shortcuts(m):
    data = old(m, B=256 if m == 16 else 64)
    assert window_acc(data, 8) > THRESHOLD  # an 8-step window passes the promotion bar
    assert window_acc(data, 1) > 0.6  # the current step alone beats chance
    frozen = old(m, B=256 if m == 16 else 64, touch_prob=0.0)
    assert stale_acc(frozen, 0, last_only=False) > 0.65  # touch_prob=0: the start mostly works


def test_old_task_m2_is_a_fixed_alternation():
    data = old(2, n=8, B=256)
    k = torch.arange(1, 9)
    predicted = data.bits.gather(1, (data.start[:, None] + k) % 2)
    assert torch.equal(predicted, data.answers)


def report() -> None:
    print("| task | m | window j=1 | j=4 | j=8 | j=8 last | start | stop@0.8 last | stop@0.8 every |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, make in (("old", old), ("current", current)):
        for m in (4, 16, 64):
            d = make(m, B=256 if m <= 16 else 64)
            stop = int(0.8 * m)
            every = (stop + (m - stop) * stale_acc(d, stop, last_only=False)) / m
            cells = [window_acc(d, 1), window_acc(d, 4), window_acc(d, min(8, m)),
                     window_acc(d, min(8, m), last_only=True), stale_acc(d, 0, False),
                     stale_acc(d, stop, True), every]
            print(f"| {name} | {m} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    report()
