"""Pointer chasing (registered as ``pointer_chase``): MQAR composed ``k`` times over a random cycle.

One sequence: a uniformly random cyclic permutation ``σ`` of the ``N = num_nodes`` nodes,
written as its ``N`` key-value pairs ``a σ(a)`` in a uniformly random order, then
``num_queries`` distinct query nodes (a uniform random subset in a random order; by default
every node). The label at query ``q`` is ``σ^k(q)``: the value of the value of ... of ``q``,
``k`` lookups.
One lookup is MQAR; ``k`` of them must be composed, each needing the previous one's
result, so depth (or loops) sets how many a model can chain. Because ``σ`` is one
``N``-cycle and ``N > max_k``, ``σ^k(q) != q``, and ``σ^k(q)`` is uniform over the other
``N - 1`` nodes: the query alone says nothing about its answer.

Format, ``seq_len = 1 + 2N + num_queries`` tokens::

    K_k  a_1 σ(a_1) ... a_N σ(a_N)  q_1 ... q_Q

Nodes are ids ``0 .. N-1`` (every node is a key once and a value once); ``K_k`` is
``N + k - 1`` for ``k = 1 .. max_k``, so ``vocab_size = N + max_k`` whatever ``k`` is.
Only the answers are scored, at their query's own position (``labels`` are already
aligned to the logits), and answers are never written into the input.

``k`` is an int, a list (one ``k`` per sequence, balanced within a batch) or ``"mixed"``
(``1 .. max_k``), as in ``hop_induction``: with more than one ``k``, position 0 is labelled
with its own ``K_k`` (a trivially learnt copy, left out of every metric) so that
:meth:`PointerChase.metrics` can report ``acc_k1``, ``acc_k2``, ...

Chance is ``1 / (N - 1)`` (0.143 at the default ``N = 8``). Shallow windows barely beat it:
the Bayes-optimal predictor that sees the last ``w`` input tokens *and its position* (an
upper bound on a lookup table of the last ``w`` tokens), at ``k = 3``, ``N = 8``,
``num_queries = 8``, averaged over the answers, computed exactly (the posterior over
``σ`` is uniform over the 5040 cycles that agree with the pairs in the window;
``tests/runners/proxy/test_hop_tasks.py`` derives it and checks it against generated batches):

    w = 1: 0.143    w = 2: 0.143    w = 4: 0.149    w = 8: 0.187

A window inside the queries sees nothing about ``σ`` (the queries are drawn independently
of it) and scores exactly ``1 / (N - 1)``; only the first queries' windows reach the last
pairs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

import torch

from nas.proxy import check_pointer_chase, hop_counts
from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    register_task,
    split_generator,
)
from runners.tasks.hop_induction import balanced_choice, per_k_metrics


def random_cycles(B: int, N: int, g: torch.Generator) -> torch.Tensor:
    """(B, N) ``σ`` with ``σ[b, a]`` the successor of ``a``: each row one uniform N-cycle."""
    order = torch.rand(B, N, generator=g).argsort(-1)
    return torch.empty(B, N, dtype=torch.long).scatter_(1, order, order.roll(-1, 1))


def chase(sigma: torch.Tensor, start: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``σ^k`` of every ``start`` (B, Q), with ``k`` (B,) lookups per row. (B, Q)."""
    node = start
    for step in range(int(k.max())):
        node = torch.where(k[:, None] > step, sigma.gather(1, node), node)
    return node


@register_task("pointer_chase")
@dataclass(frozen=True)
class PointerChase:
    """k-fold lookup over a random cycle; see the module docstring for the exact format."""

    num_nodes: int = 8
    num_queries: Optional[int] = None  # None: every node, once
    k: Union[int, tuple[int, ...], str] = 3
    max_k: int = 4
    name: ClassVar[str] = "pointer_chase"

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", self.k if isinstance(self.k, (int, str)) else tuple(self.k))
        check_pointer_chase(self.num_nodes, self.num_queries, self.k, self.max_k)
        if self.num_queries is None:
            object.__setattr__(self, "num_queries", self.num_nodes)

    @property
    def ks(self) -> tuple[int, ...]:
        return hop_counts(self.k, self.max_k)

    @property
    def vocab_size(self) -> int:
        return self.num_nodes + self.max_k

    @property
    def seq_len(self) -> int:
        return 1 + 2 * self.num_nodes + self.num_queries

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        B, N = batch_size, self.num_nodes
        k = balanced_choice(self.ks, B, g)  # (B,)
        sigma = random_cycles(B, N, g)
        keys = torch.rand(B, N, generator=g).argsort(-1)  # the pairs' written order
        pairs = torch.stack([keys, sigma.gather(1, keys)], -1).view(B, 2 * N)
        queries = torch.rand(B, N, generator=g).argsort(-1)[:, : self.num_queries]
        head = (N + k - 1)[:, None]
        first = head if len(self.ks) > 1 else torch.full_like(head, IGNORE_INDEX)
        inputs = torch.cat([head, pairs, queries], 1)
        labels = torch.cat([first, torch.full_like(pairs, IGNORE_INDEX), chase(sigma, queries, k)], 1)
        return inputs, labels

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per answer, ``seq_acc`` per sequence; ``acc_k{k}`` when k is mixed.
        Position 0 (the hop-count copy, when labelled) is never scored."""
        answers = labels[:, 1:]
        out = accuracy_metrics(logits[:, 1:], answers)
        if len(self.ks) > 1:
            row_k = labels[:, 0] - self.num_nodes + 1
            out.update(per_k_metrics(logits[:, 1:], answers, row_k, self.ks))
        return out
