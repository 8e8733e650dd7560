"""State tracking + recall (LT2 §3.6, after Olmo-hybrid's state-based recall) and its curriculum.

The task joins two pressures on one answer. *Recall*: a table of ``m`` bits, each written
next to its address, must be read back Θ(m) tokens later (hard for a fixed-size
recurrent state once ``m`` is large). *State tracking*: a pointer into that table is
moved by a running sequence of ``n`` permutations of S_m (hard for fixed-depth
attention, which is in TC^0, while tracking a point under S_m is NC^1-hard for m >= 5).

One sequence, ``T = 3 + 2m + n(2m + 1)`` tokens::

    BOS  a_1 b(a_1) ... a_m b(a_m)  SEP  p_0  [x_1 π_1(x_1) ... x_m π_1(x_m) ASK] ... [... ASK]

* ``a_1..a_m`` is a random order of the addresses ``0..m-1``; ``b(a)`` is ``BIT0`` or
  ``BIT1``. The table is *balanced*: exactly ``m/2`` ones at random addresses, so that a
  predictor that knows the table but not the pointer scores exactly chance (with
  independent bits, guessing the table's majority bit would beat 0.5 at small m).
* ``p_0`` is the pointer's start address (uniform).
* Step ``k`` is a uniformly random permutation ``π_k`` of S_m, written as its ``m``
  pairs ``x π_k(x)`` in a random order, then ``ASK``; the pointer moves to
  ``p_k = π_k(p_{k-1})``. The steps are drawn independently of the pointer and of each
  other, and every step names every address, so its tokens say nothing about where the
  pointer is, while the pointer moves at each step with probability ``1 - 1/m``.
  Given anything short of ``p_0`` *and every step since*, ``p_k`` is uniform: a
  predictor that sees only the last ``j`` steps, only the current step, only the
  start address, or that tracks through 80% of the steps and then stops, scores
  exactly chance on the answers it cannot follow (``tests/test_task_shortcuts.py``).
  At ``m = 2`` a step is the identity or the swap with probability 1/2 each: the answer
  is the parity of the swaps, not a fixed alternation.
* The label at each ``ASK`` is ``b(p_k)``; nothing else is scored. The answer is never
  written into the input, so earlier answers leak nothing about the pointer.

The paper's ``n`` and ``m`` map to: ``m`` bits (the pointer's domain is the table, and
the permutations are elements of S_m), ``n`` permutation applications (one answer
each). The curriculum grows them together, ``n = m``; the sequence grows as ``2mn``, so
stages past 32 are for a GPU. The vocabulary holds ``max_m`` address tokens whatever
``m`` is, so every curriculum stage shares one vocabulary and a model can be promoted
without changing its embedding; a longer evaluation (more steps ``n`` at the same ``m``)
shares it too, which is how length extrapolation is measured.

Metrics: ``acc`` scores every answer, ``last_acc`` only the last one (``p_n``, reached by
tracking through all ``n`` steps), ``seq_acc`` all answers of a sequence. Scoring every
answer lets a model that tracks 80% of the way pass 0.90, so ``last_acc`` is the quality
and promotion metric. Chance is 0.5 for all three per answer (``seq_acc``: 2^-n).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    last_answer_accuracy,
    register_task,
    split_generator,
)

CURRICULUM_STAGES = (8, 16, 32, 64, 128, 256)


@register_task("state_tracking")
@dataclass(frozen=True)
class StateTracking:
    """State tracking + recall; see the module docstring for the exact format."""

    n: int = 8
    m: int = 8
    max_m: int = 256
    name: ClassVar[str] = "state_tracking"
    quality_metric: ClassVar[str] = "last_acc"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 2 <= self.m <= self.max_m:
            raise ValueError(f"m must be in 2..max_m={self.max_m}, got m={self.m}")
        if self.m % 2:
            raise ValueError(f"m must be even (the bit table is balanced), got m={self.m}")

    # Token ids: addresses are 0..max_m-1, then the five specials.
    @property
    def bit0_id(self) -> int:
        return self.max_m

    @property
    def bit1_id(self) -> int:
        return self.max_m + 1

    @property
    def bos_id(self) -> int:
        return self.max_m + 2

    @property
    def sep_id(self) -> int:
        return self.max_m + 3

    @property
    def ask_id(self) -> int:
        return self.max_m + 4

    @property
    def vocab_size(self) -> int:
        return self.max_m + 5

    @property
    def seq_len(self) -> int:
        return 3 + 2 * self.m + self.n * (2 * self.m + 1)

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        B, m, n = batch_size, self.m, self.n
        bits = (torch.rand(B, m, generator=g).argsort(-1) < m // 2).long()  # balanced
        order = torch.rand(B, m, generator=g).argsort(-1)  # (B, m) addresses in table order
        table = torch.stack([order, self.bit0_id + bits.gather(1, order)], -1).view(B, 2 * m)
        start = torch.randint(0, m, (B, 1), generator=g)
        perms = torch.rand(B, n, m, generator=g).argsort(-1)  # (B, n, m): perms[b, k, x] = π_k(x)
        xs = torch.rand(B, n, m, generator=g).argsort(-1)  # the order the pairs are written in
        pairs = torch.stack([xs, perms.gather(2, xs)], -1).view(B, n, 2 * m)
        steps = torch.cat([pairs, torch.full((B, n, 1), self.ask_id)], -1)  # (B, n, 2m + 1)
        answers = torch.empty(B, n, dtype=torch.long)
        ptr = start
        for k in range(n):
            ptr = perms[:, k].gather(1, ptr)
            answers[:, k] = bits.gather(1, ptr)[:, 0]
        head = torch.tensor([self.bos_id]).expand(B, 1)
        sep = torch.tensor([self.sep_id]).expand(B, 1)
        inputs = torch.cat([head, table, sep, start, steps.view(B, -1)], 1)
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels[:, 3 + 2 * m + 2 * m :: 2 * m + 1] = self.bit0_id + answers
        return inputs, labels

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per answer, ``last_acc`` on the last answer only, ``seq_acc`` per sequence."""
        return {**accuracy_metrics(logits, labels), "last_acc": last_answer_accuracy(logits, labels)}


@dataclass
class Curriculum:
    """LT2's curriculum: stages n = m, promote once eval accuracy reaches ``threshold``.

    A trainer trains on :meth:`task`, evaluates, and calls :meth:`promote` with the eval
    value of :attr:`metric`; the step budget per stage is the trainer's. The headline
    result is :attr:`n_max`, the largest n solved (0 if none); :attr:`stage_acc` keeps the
    best value reported at each stage reached.

    LT2 and the BRIEF say "promote at 0.90 eval accuracy" without saying which answers
    count. ``metric = "last_acc"`` (the default) scores only the answer after the last
    step, which needs tracking from the start to the end; ``"acc"`` averages every
    answer, and a model that tracks 80% of the way and then guesses scores about
    0.8 + 0.2 * 0.5 = 0.90 on it.
    """

    stages: tuple[int, ...] = CURRICULUM_STAGES
    threshold: float = 0.90
    metric: str = "last_acc"
    stage_acc: dict[int, float] = field(default_factory=dict)
    index: int = 0

    def __post_init__(self) -> None:
        if not self.stages or any(b <= a for a, b in zip(self.stages, self.stages[1:])):
            raise ValueError(f"stages must be non-empty and increasing, got {self.stages}")
        if self.stages[0] < 2 or any(n % 2 for n in self.stages):
            raise ValueError(f"stages must be even and >= 2, got {self.stages}")
        if self.metric not in ("last_acc", "acc", "seq_acc"):
            raise ValueError(f"metric must be 'last_acc', 'acc' or 'seq_acc', got {self.metric!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    @property
    def done(self) -> bool:
        return self.index >= len(self.stages)

    @property
    def n(self) -> int:
        """The current stage's n (= m)."""
        if self.done:
            raise RuntimeError("the curriculum is finished: every stage is solved")
        return self.stages[self.index]

    @property
    def n_max(self) -> int:
        return self.stages[self.index - 1] if self.index else 0

    def task(self, **params: object) -> StateTracking:
        """The current stage's task; ``max_m`` is the last stage, so vocabularies match."""
        return StateTracking(n=self.n, m=self.n, max_m=self.stages[-1], **params)

    def promote(self, eval_acc: float) -> bool:
        """Record ``eval_acc`` (the eval value of :attr:`metric`) at the current stage;
        advance and return True if it is solved."""
        if not 0.0 <= eval_acc <= 1.0:
            raise ValueError(f"eval_acc must be in [0, 1], got {eval_acc}")
        n = self.n
        self.stage_acc[n] = max(self.stage_acc.get(n, 0.0), eval_acc)
        if eval_acc < self.threshold:
            return False
        self.index += 1
        return True

    def summary(self) -> dict[str, object]:
        return {"n_max": self.n_max, "stage_acc": dict(self.stage_acc), "metric": self.metric}
