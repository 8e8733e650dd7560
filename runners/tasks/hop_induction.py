"""k-hop induction heads (Sanford, Hsu & Telgarsky 2024), registered as ``hop_induction``.

A string ``x_0 .. x_{n-1}`` over an alphabet of ``alphabet_size`` letters with no two equal
neighbours (``x_0`` uniform, then each letter uniform over the others). ``hop(i)`` is one
past the last earlier occurrence of ``x_i``: ``j + 1`` for the largest ``j < i`` with
``x_j = x_i``, undefined when ``x_i`` has not occurred before. Since neighbours differ,
``j <= i - 2`` and ``hop(i) < i``. The label at letter ``i`` is ``x[hop^k(i)]``, the letter
an induction head would copy, composed ``k`` times; positions where ``hop^k(i)`` is
undefined are not scored. One induction hop is one attention lookup, so ``k`` hops need
depth: Sanford et al. show log k layers suffice and are needed, and Saunshi et al. (2025)
use it to show a looped block matching a deeper one.

Format: ``seq_len = n + 1`` tokens, the hop-count token first, then the string::

    K_k  x_0 x_1 ... x_{n-1}

Letters are ids ``0 .. alphabet_size-1``; ``K_k`` is ``alphabet_size + k - 1`` for
``k = 1 .. max_k``, so ``vocab_size = alphabet_size + max_k`` whatever ``k`` is, and a model
trained at one ``k`` can be evaluated at another (this is Sanford et al.'s layout: their
input is the hop token, then the string). ``labels[:, t]`` is the target of the logits at
``t`` (already aligned): the label of letter ``i`` sits at position ``i + 1``, the letter's
own position, so it is a function of the inputs up to and including ``t``.

``k`` is an int, a list of ints (each sequence draws one, balanced within a batch: a batch
of ``B`` rows holds each ``k`` ``B / len(k)`` times, rounded, in a random order), or
``"mixed"`` (``1 .. max_k``). With more than one ``k`` the model must read ``K_k``; then
position 0 is labelled with ``K_k`` itself, a copy of its own input that is trivially
learnt and left out of every metric, so that :meth:`HopInduction.metrics`, which sees only
logits and labels, can split accuracy by ``k``. With a single ``k`` position 0 is not scored.

Metrics: ``acc`` over scored letters, ``seq_acc`` per sequence (every scored letter right),
and, when ``k`` is mixed, ``acc_k1``, ``acc_k2``, ... (NaN for a ``k`` absent from a batch,
which happens only when ``batch_size < len(k)``).

Shallow windows score well above chance (the BRIEF asks to report them): most hop chains
stay local. The Bayes-optimal accuracy of a lookup table on the last ``w`` input tokens (left
padded), at ``k = 3``, ``n = 32``, ``alphabet_size = 4``, over scored letters, estimated on
2M sequences (the plug-in estimate, an upper bound in expectation, and the held-out one, a
lower bound, agree to 3e-4; ``tests/runners/proxy/test_hop_tasks.py`` brackets them on 40k sequences):

    w = 1: 0.295    w = 2: 0.355    w = 4: 0.452    w = 8: 0.691

Chance: the process is symmetric under renaming the letters, so every label is uniform and
a constant guesser scores exactly ``1 / alphabet_size``. At ``k = 1, 2, 3, 4`` (``n = 32``)
about 28, 25, 22, 19 of the 32 letters are scored: each hop leaves about three more
undefined (the first occurrences of the letters, and positions that hop onto them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

import torch

from nas.proxy import check_hop_induction, hop_counts
from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    register_task,
    split_generator,
)


def no_repeat_string(B: int, n: int, alphabet_size: int, g: torch.Generator) -> torch.Tensor:
    """(B, n) letters, no two equal neighbours: each step adds 1..A-1 modulo A."""
    first = torch.randint(0, alphabet_size, (B, 1), generator=g)
    steps = torch.randint(1, alphabet_size, (B, n - 1), generator=g)
    return torch.cat([first, first + steps.cumsum(1)], 1) % alphabet_size


def hop_indices(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``hop^k(i)`` for every letter of ``x`` (B, n), with ``k`` (B,) hops per row; -1 where
    undefined. (B, n)."""
    B, n = x.shape
    pos = torch.arange(n)
    earlier = (x[:, :, None] == x[:, None, :]) & (pos[None, :] < pos[:, None])  # (B, i, j)
    last = torch.where(earlier, pos, -1).amax(-1)  # (B, n) last earlier occurrence
    hop = torch.where(last >= 0, last + 1, -1)
    index = pos.expand(B, n)
    for step in range(int(k.max())):
        moved = torch.where(index >= 0, hop.gather(1, index.clamp(min=0)), -1)
        index = torch.where(k[:, None] > step, moved, index)
    return index


def balanced_choice(options: tuple[int, ...], B: int, g: torch.Generator) -> torch.Tensor:
    """(B,) values of ``options``, each ``B / len(options)`` times (rounded), in a random order."""
    if len(options) == 1:
        return torch.full((B,), options[0])
    offset = int(torch.randint(0, len(options), (1,), generator=g))  # who gets the remainder
    which = (torch.arange(B) + offset) % len(options)
    return torch.tensor(options)[which[torch.randperm(B, generator=g)]]


def per_k_metrics(logits: torch.Tensor, labels: torch.Tensor, row_k: torch.Tensor,
                  ks: tuple[int, ...]) -> dict[str, float]:
    """``acc_k{k}`` over the rows of each hop count (NaN when a batch has none)."""
    out = {}
    for k in ks:
        rows = row_k == k
        scored = rows.any() and (labels[rows] != IGNORE_INDEX).any()
        out[f"acc_k{k}"] = (accuracy_metrics(logits[rows], labels[rows])["acc"] if scored
                            else float("nan"))
    return out


@register_task("hop_induction")
@dataclass(frozen=True)
class HopInduction:
    """k-hop induction heads; see the module docstring for the exact format."""

    n: int = 32
    k: Union[int, tuple[int, ...], str] = 3
    alphabet_size: int = 4
    max_k: int = 4
    name: ClassVar[str] = "hop_induction"

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", self.k if isinstance(self.k, (int, str)) else tuple(self.k))
        check_hop_induction(self.n, self.k, self.alphabet_size, self.max_k)

    @property
    def ks(self) -> tuple[int, ...]:
        return hop_counts(self.k, self.max_k)

    @property
    def vocab_size(self) -> int:
        return self.alphabet_size + self.max_k

    @property
    def seq_len(self) -> int:
        return self.n + 1

    def k_token(self, k: torch.Tensor | int) -> torch.Tensor | int:
        return self.alphabet_size + k - 1

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        k = balanced_choice(self.ks, batch_size, g)  # (B,)
        x = no_repeat_string(batch_size, self.n, self.alphabet_size, g)  # (B, n)
        index = hop_indices(x, k)
        answers = torch.where(index >= 0, x.gather(1, index.clamp(min=0)), IGNORE_INDEX)
        head = self.k_token(k)[:, None]
        first = head if len(self.ks) > 1 else torch.full_like(head, IGNORE_INDEX)
        return torch.cat([head, x], 1), torch.cat([first, answers], 1)

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per scored letter, ``seq_acc`` per sequence; ``acc_k{k}`` when k is mixed.
        Position 0 (the hop-count copy, when labelled) is never scored."""
        letters = labels[:, 1:]
        out = accuracy_metrics(logits[:, 1:], letters)
        if len(self.ks) > 1:
            row_k = labels[:, 0] - self.alphabet_size + 1
            out.update(per_k_metrics(logits[:, 1:], letters, row_k, self.ks))
        return out
