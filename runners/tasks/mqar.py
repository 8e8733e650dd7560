"""Multi-query associative recall (MQAR), as in Zoology (Arora et al., 2023).

One sequence of ``seq_len`` tokens: ``num_kv_pairs`` key-value pairs ``k_1 v_1 ... k_K v_K``
(distinct keys from the lower half of the vocabulary, values from the upper half, drawn
with replacement), then a query region in which every key is asked once. Query ``i``
sits at offset ``2 * gap_i`` of the region, where the gaps are drawn without replacement
from ``0..space-1`` (``space = (seq_len - 2K) // 2``) with Zoology's power law,
``P(gap = j) ∝ (j + 1) ** (power_a - 1)``: with the default ``power_a = 0.01`` most
queries come soon after the pairs; ``power_a = 1`` places them uniformly. The label at a
query's position is its key's value; nothing else is scored. Every other query-region
token is noise drawn from the value half (Zoology's ``random_non_queries``, restricted to
values so that a noise token is never mistaken for a query).

Chance: a constant guesser is right about once in ``vocab_size // 2`` queries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    register_task,
    split_generator,
)


@register_task("mqar")
@dataclass(frozen=True)
class MQAR:
    """Zoology's MQAR with power-law query placement; see the module docstring."""

    vocab_size: int = 8192
    seq_len: int = 256
    num_kv_pairs: int = 16
    power_a: float = 0.01
    name: ClassVar[str] = "mqar"

    def __post_init__(self) -> None:
        k = self.num_kv_pairs
        if not 1 <= k <= self.vocab_size // 2:
            raise ValueError(f"need 1 <= num_kv_pairs <= vocab_size // 2, got {k}")
        if self.seq_len < 4 * k:
            raise ValueError(f"seq_len must be >= 4 * num_kv_pairs = {4 * k}, got {self.seq_len}")
        if self.power_a <= 0:
            raise ValueError(f"power_a must be > 0, got {self.power_a}")

    @property
    def num_keys(self) -> int:
        """Keys are the ids ``0..num_keys-1``; values the rest."""
        return self.vocab_size // 2

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        B, K, V, half = batch_size, self.num_kv_pairs, self.vocab_size, self.num_keys
        keys = torch.rand(B, half, generator=g).topk(K, -1).indices  # (B, K) distinct
        values = torch.randint(half, V, (B, K), generator=g)
        context = torch.stack([keys, values], -1).view(B, 2 * K)
        region = self.seq_len - 2 * K
        space = region // 2
        weights = torch.arange(1, space + 1, dtype=torch.float64) ** (self.power_a - 1)
        gaps = torch.multinomial(weights.expand(B, space), K, replacement=False, generator=g)
        queries = torch.randint(half, V, (B, region), generator=g).scatter(1, 2 * gaps, keys)
        answers = torch.full((B, region), IGNORE_INDEX).scatter(1, 2 * gaps, values)
        inputs = torch.cat([context, queries], 1)
        labels = torch.cat([torch.full_like(context, IGNORE_INDEX), answers], 1)
        return inputs, labels

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per query, ``seq_acc`` per sequence (every query right)."""
        return accuracy_metrics(logits, labels)
