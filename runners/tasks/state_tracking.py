"""State tracking + recall (LT2 §3.6, after Olmo-hybrid's state-based recall) and its curriculum.

The task joins two pressures on one answer. *Recall*: a table of ``m`` bits, each written
next to its address, must be read back Θ(m) tokens later (hard for a fixed-size
recurrent state once ``m`` is large). *State tracking*: a pointer into that table is
moved by a running sequence of ``n`` permutations of S_m (hard for fixed-depth
attention, which is in TC^0, while tracking a point under S_m is NC^1-hard for m >= 5).

One sequence, ``T = 3 + 2m + n(3m/2 + 1)`` tokens::

    BOS  a_1 b(a_1) ... a_m b(a_m)  SEP  p_0  [x_1 y_1 f_1 ... x_{m/2} y_{m/2} f_{m/2} ASK] ...

* ``a_1..a_m`` is a random order of the addresses ``0..m-1``; ``b(a)`` is ``BIT0`` or
  ``BIT1``. The table is *balanced*: exactly ``m/2`` ones at random addresses, so that a
  predictor that knows the table but not the pointer scores exactly chance (with
  independent bits, guessing the table's majority bit would beat 0.5 at small m).
* ``p_0`` is the pointer's start address (uniform).
* Step ``k`` is a uniformly random perfect matching of the ``m`` addresses, written as
  ``m/2`` triples ``x y f`` in a random order: the pair ``{x, y}`` is swapped if its
  flag ``f`` is ``BIT1`` (probability ``1 - 1/m``) and left alone if ``BIT0``. Every
  address appears exactly once per step, so the swaps are disjoint: applying them one by
  one, as a recurrent reader does, is the same as applying the step at once. Disjoint
  transpositions generate S_m, so the steps compose to arbitrary permutations.
* Given ``p_{k-1}``, the pointer stays put with probability ``1/m`` and otherwise moves
  to its partner, uniform over the other ``m - 1`` addresses: ``p_k`` is uniform after
  every step. The steps are drawn independently of the pointer and of each other, and
  name every address, so their tokens say nothing about where the pointer is. Given
  anything short of ``p_0`` *and every step since*, ``p_k`` is uniform: a predictor that
  sees only the last ``j`` steps, only the current step, only the start address, or
  that tracks through 80% of the steps and then stops, scores exactly chance on the
  answers it cannot follow (``tests/runners/proxy/test_task_shortcuts.py``). At ``m = 2`` a step is
  the identity or the swap with probability 1/2 each: the answer is the parity of the
  swaps, not a fixed alternation.
* The label at each ``ASK`` is ``b(p_k)``. With ``supervise_pointer`` (the default) the
  last token of each step is labelled with the pointer ``p_k`` itself, an intermediate
  target in the manner of the S5 word problem's labelled prefixes. Neither is ever
  written into the input, so earlier answers leak nothing about the pointer.

  Why the pointer label: the task has no shortcut, so every partial view of a sequence
  (any window, the start, the table) is exactly uncorrelated with the bit, and gradient
  descent gets no signal until a model composes the whole chain; without the label a
  4-layer-equivalent proxy stays at chance even at m = 2 after 1000 steps. The pointer
  label turns each step into one supervised lookup. It is a training signal only: the
  metrics below score the bits, and the inputs are the same either way.

The paper's ``n`` and ``m`` map to: ``m`` bits (the pointer's domain is the table, and
the permutations are elements of S_m), ``n`` permutation applications (one answer
each). The curriculum grows them together, ``n = m``; the sequence grows as ``1.5mn``, so
stages past 32 are for a GPU. The vocabulary holds ``max_m`` address tokens whatever
``m`` is, so every curriculum stage shares one vocabulary and a model can be promoted
without changing its embedding; a longer evaluation (more steps ``n`` at the same ``m``)
shares it too, which is how length extrapolation is measured.

Metrics (bit answers only): ``acc`` scores every answer, ``last_acc`` only the last one
(``b(p_n)``, reached by tracking through all ``n`` steps), ``seq_acc`` all answers of a
sequence; ``ptr_acc`` scores the pointer labels when present. Scoring every answer lets
a model that tracks 80% of the way pass 0.90, so ``last_acc`` is the quality and
promotion metric. Chance is 0.5 per answer (``seq_acc``: 2^-n; ``ptr_acc``: 1/m).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from nas.proxy import CURRICULUM_STAGES, check_curriculum, check_state_tracking
from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    last_answer_accuracy,
    register_task,
    split_generator,
)


@register_task("state_tracking")
@dataclass(frozen=True)
class StateTracking:
    """State tracking + recall; see the module docstring for the exact format."""

    n: int = 8
    m: int = 8
    max_m: int = 256
    supervise_pointer: bool = True
    name: ClassVar[str] = "state_tracking"
    quality_metric: ClassVar[str] = "last_acc"

    def __post_init__(self) -> None:
        check_state_tracking(self.n, self.m, self.max_m)

    # Token ids: addresses are 0..max_m-1, then the five specials (a step's flags are bits).
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
    def step_len(self) -> int:
        """Tokens per step: ``m/2`` triples, then ``ASK``."""
        return 3 * self.m // 2 + 1

    @property
    def seq_len(self) -> int:
        return 3 + 2 * self.m + self.n * self.step_len

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
        order = torch.rand(B, n, m, generator=g).argsort(-1)
        x, y = order[..., 0::2], order[..., 1::2]  # (B, n, m/2) the matching, as written
        swap = torch.rand(B, n, m // 2, generator=g) < 1 - 1 / m
        perms = torch.arange(m).repeat(B, n, 1)  # (B, n, m): perms[b, k, p] = p_k given p_{k-1} = p
        perms.scatter_(2, x, torch.where(swap, y, x)).scatter_(2, y, torch.where(swap, x, y))
        triples = torch.stack([x, y, self.bit0_id + swap.long()], -1).view(B, n, 3 * m // 2)
        steps = torch.cat([triples, torch.full((B, n, 1), self.ask_id)], -1)  # (B, n, step_len)
        answers = torch.empty(B, n, dtype=torch.long)
        pointers = torch.empty(B, n, dtype=torch.long)
        ptr = start
        for k in range(n):
            ptr = perms[:, k].gather(1, ptr)
            pointers[:, k] = ptr[:, 0]
            answers[:, k] = bits.gather(1, ptr)[:, 0]
        head = torch.tensor([self.bos_id]).expand(B, 1)
        sep = torch.tensor([self.sep_id]).expand(B, 1)
        inputs = torch.cat([head, table, sep, start, steps.view(B, -1)], 1)
        labels = torch.full_like(inputs, IGNORE_INDEX)
        first_ask = 3 + 2 * m + self.step_len - 1
        labels[:, first_ask :: self.step_len] = self.bit0_id + answers
        if self.supervise_pointer:
            labels[:, first_ask - 1 :: self.step_len] = pointers
        return inputs, labels

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per bit answer, ``last_acc`` on the last one only, ``seq_acc`` per
        sequence; ``ptr_acc`` on the pointer labels, if any."""
        is_ptr = (labels != IGNORE_INDEX) & (labels < self.bit0_id)
        bit_labels = labels.masked_fill(is_ptr, IGNORE_INDEX)
        out = {**accuracy_metrics(logits, bit_labels),
               "last_acc": last_answer_accuracy(logits, bit_labels)}
        if is_ptr.any():
            out["ptr_acc"] = accuracy_metrics(logits, labels.masked_fill(~is_ptr, IGNORE_INDEX))["acc"]
        return out


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
        check_curriculum(self.stages, self.threshold, self.metric)

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
