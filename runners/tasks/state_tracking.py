"""State tracking + recall (LT2 §3.6, after Olmo-hybrid's state-based recall) and its curriculum.

The task joins two pressures on one answer. *Recall*: a table of ``m`` bits, each written
next to its address, must be read back Θ(m) tokens later (hard for a fixed-size
recurrent state once ``m`` is large). *State tracking*: a pointer into that table is
moved by a running sequence of ``n`` permutations (hard for fixed-depth attention,
which is in TC^0, while tracking a point under S_m is NC^1-hard for m >= 5).

One sequence, ``T = 3 + 2m + 3n`` tokens::

    BOS  a_1 b(a_1) ... a_m b(a_m)  SEP  p_0  x_1 y_1 ASK  ...  x_n y_n ASK

* ``a_1..a_m`` is a random order of the addresses ``0..m-1``; ``b(a)`` is ``BIT0`` or
  ``BIT1``, the bit stored at address ``a`` (uniform, independent).
* ``p_0`` is the pointer's start address (uniform).
* Step ``k`` applies the transposition ``(x_k y_k)`` of S_m to the pointer:
  ``p_k = y_k if p_{k-1} = x_k``, ``x_k if p_{k-1} = y_k``, else ``p_{k-1}``.
  Transpositions generate S_m, so the steps compose to arbitrary permutations. With
  probability ``touch_prob`` the step is drawn to involve the pointer (other end uniform),
  otherwise both ends are uniform; the two ends are written in random order. So the
  pointer moves at about half the steps and a model that stops tracking falls to chance.
* The label at each ``ASK`` is ``b(p_k)``; nothing else is scored. The answer is never
  written into the input, so earlier answers leak nothing about the pointer.

The paper's ``n`` and ``m`` map to: ``m`` bits (the pointer's domain is the table, and
the permutations are elements of S_m), ``n`` permutation applications (one answer
each). The curriculum grows them together, ``n = m``. The vocabulary holds ``max_m``
address tokens whatever ``m`` is, so every curriculum stage shares one vocabulary and a
model can be promoted without changing its embedding.

Chance: answers are uniform bits, so a constant guesser scores ``acc`` about 0.5.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
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
    touch_prob: float = 0.5
    name: ClassVar[str] = "state_tracking"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 2 <= self.m <= self.max_m:
            raise ValueError(f"need 2 <= m <= max_m, got m={self.m}, max_m={self.max_m}")
        if not 0.0 <= self.touch_prob <= 1.0:
            raise ValueError(f"touch_prob must be in [0, 1], got {self.touch_prob}")

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
        return 3 + 2 * self.m + 3 * self.n

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        B, m, n = batch_size, self.m, self.n
        bits = torch.randint(0, 2, (B, m), generator=g)
        order = torch.rand(B, m, generator=g).argsort(-1)  # (B, m) addresses in table order
        table = torch.stack([order, self.bit0_id + bits.gather(1, order)], -1).view(B, 2 * m)
        start = torch.randint(0, m, (B, 1), generator=g)
        steps, answers = self._walk(bits, start[:, 0], g)
        head = torch.tensor([self.bos_id]).expand(B, 1)
        sep = torch.tensor([self.sep_id]).expand(B, 1)
        inputs = torch.cat([head, table, sep, start, steps.view(B, 3 * n)], 1)
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels[:, 3 + 2 * m + 2 :: 3] = self.bit0_id + answers
        return inputs, labels

    def _walk(
        self, bits: torch.Tensor, ptr: torch.Tensor, g: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw the n transpositions and follow the pointer: steps (B, n, 3), answers (B, n)."""
        B, m, n = bits.shape[0], self.m, self.n
        touch = torch.rand(B, n, generator=g) < self.touch_prob
        free_end = torch.randint(0, m, (B, n), generator=g)
        offset = torch.randint(1, m, (B, n), generator=g)  # other end != first end
        flip = torch.rand(B, n, generator=g) < 0.5
        steps = torch.full((B, n, 3), self.ask_id, dtype=torch.long)
        answers = torch.empty(B, n, dtype=torch.long)
        for k in range(n):
            x = torch.where(touch[:, k], ptr, free_end[:, k])
            y = (x + offset[:, k]) % m
            ptr = torch.where(ptr == x, y, torch.where(ptr == y, x, ptr))
            steps[:, k, 0] = torch.where(flip[:, k], y, x)
            steps[:, k, 1] = torch.where(flip[:, k], x, y)
            answers[:, k] = bits.gather(1, ptr[:, None])[:, 0]
        return steps, answers

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per answer, ``seq_acc`` per sequence (all n answers right)."""
        return accuracy_metrics(logits, labels)


@dataclass
class Curriculum:
    """LT2's curriculum: stages n = m, promote once eval accuracy reaches ``threshold``.

    A trainer trains on :meth:`task`, evaluates, and calls :meth:`promote` with the eval
    accuracy; the step budget per stage is the trainer's. The headline result is
    :attr:`n_max`, the largest n solved (0 if none); :attr:`stage_acc` keeps the best eval
    accuracy reported at each stage reached.
    """

    stages: tuple[int, ...] = CURRICULUM_STAGES
    threshold: float = 0.90
    stage_acc: dict[int, float] = field(default_factory=dict)
    index: int = 0

    def __post_init__(self) -> None:
        if not self.stages or any(b <= a for a, b in zip(self.stages, self.stages[1:])):
            raise ValueError(f"stages must be non-empty and increasing, got {self.stages}")
        if self.stages[0] < 2:
            raise ValueError(f"the first stage must be >= 2, got {self.stages[0]}")
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
        """Record ``eval_acc`` at the current stage; advance and return True if it is solved."""
        if not 0.0 <= eval_acc <= 1.0:
            raise ValueError(f"eval_acc must be in [0, 1], got {eval_acc}")
        n = self.n
        self.stage_acc[n] = max(self.stage_acc.get(n, 0.0), eval_acc)
        if eval_acc < self.threshold:
            return False
        self.index += 1
        return True

    def summary(self) -> dict[str, object]:
        return {"n_max": self.n_max, "stage_acc": dict(self.stage_acc)}
