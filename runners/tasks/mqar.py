"""Multi-query associative recall (MQAR), as in Zoology (Arora et al., 2023).

One sequence: ``K = num_kv_pairs`` key-value pairs ``k_1 v_1 ... k_K v_K``, then a query
region in which every key is asked once. Query ``i`` sits at offset ``2 * gap_i`` of the
region, where the gaps are drawn without replacement from ``0..space-1``
(``space = (seq_len - 2K) // 2``) with Zoology's power law,
``P(gap = j) ∝ (j + 1) ** (power_a - 1)``: with the default ``power_a = 0.01`` most
queries come soon after the pairs; ``power_a = 1`` places them uniformly. The label at a
query's position is its key's value; nothing else is scored.

``zoology=True`` (the default) follows Zoology's ``multiquery_ar`` exactly: keys are
distinct ids from ``1..V/2-1`` (0 is Zoology's placeholder), values are *distinct* ids
from the upper half, and every non-query token of the query region is noise drawn from
the *whole* vocabulary, so key-like distractors occur (unscored; a distractor may even
repeat a context key before its query). ``zoology=False`` is loopnas's earlier variant,
kept reachable bit for bit: keys from ``0..V/2-1``, values drawn with replacement, noise
from the value half only, so every key-half token after the pairs is a query.

Zoology also trains on a *fixed* train set that mixes several ``(seq_len, num_kv_pairs)``
settings and tests on a fixed test set of other settings (longer, more pairs).
``train_settings`` / ``test_settings`` take ``(seq_len, num_kv_pairs, num_examples)``
triples, or ``"zoology"`` for the paper's (``ZOOLOGY_TRAIN``, ``ZOOLOGY_TEST``). Then
example ``i`` of a split is a pure function of ``(data_seed, split, i)`` (nothing is
stored), a batch draws example indices uniformly with replacement (Zoology shuffles
epochs; the two agree in distribution), and a shorter example is right-padded with token
0, unscored. Train batches are ``seq_len`` wide (it must hold the longest train
setting); eval batches are as wide as the longest test setting. Without settings, both
splits are fresh draws from the one ``(seq_len, num_kv_pairs)`` setting.

Chance, two ways: a constant guesser is right once in ``vocab_size // 2`` queries; a
model that has learnt to copy *some* value of the context, but not the right one, is
right about once in ``K`` queries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

import torch

from nas.proxy import ZOOLOGY_TEST, ZOOLOGY_TRAIN, Settings, check_mqar
from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    register_task,
    split_generator,
)

_SPLIT_SALT = {"train": 0x7A11, "eval": 0x7E57}


@register_task("mqar")
@dataclass(frozen=True)
class MQAR:
    """Zoology's MQAR with power-law query placement; see the module docstring."""

    vocab_size: int = 8192
    seq_len: int = 256
    num_kv_pairs: int = 16
    power_a: float = 0.01
    zoology: bool = True
    train_settings: Union[Settings, str, None] = None
    test_settings: Union[Settings, str, None] = None
    data_seed: int = 0
    name: ClassVar[str] = "mqar"

    def __post_init__(self) -> None:
        train, test = check_mqar(self.vocab_size, self.seq_len, self.num_kv_pairs, self.power_a,
                                 self.zoology, self.train_settings, self.test_settings)
        object.__setattr__(self, "train_settings", train)
        object.__setattr__(self, "test_settings", test)

    @property
    def num_keys(self) -> int:
        """Keys are ids below ``num_keys`` (from 1 with ``zoology``); values the rest."""
        return self.vocab_size // 2

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        if self.train_settings is None:
            return self._generate(batch_size, self.seq_len, self.num_kv_pairs, g)
        settings = self.train_settings if split == "train" else self.test_settings
        width = self.seq_len if split == "train" else max(self.seq_len, *(s[0] for s in settings))
        counts = torch.tensor([s[2] for s in settings])
        indices = torch.randint(0, int(counts.sum()), (batch_size,), generator=g).tolist()
        inputs = torch.zeros(batch_size, width, dtype=torch.long)
        labels = torch.full((batch_size, width), IGNORE_INDEX)
        for row, i in enumerate(indices):
            x, y = self.example(i, split)
            inputs[row, : len(x)], labels[row, : len(y)] = x, y
        return inputs, labels

    def example(self, index: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """Example ``index`` of the fixed ``split`` set (unpadded): a pure function of
        ``(data_seed, split, index)``."""
        settings = self.train_settings if split == "train" else self.test_settings
        if settings is None:
            raise ValueError("example() needs train_settings / test_settings")
        for length, k, count in settings:
            if index < count:
                break
            index -= count
        else:
            raise IndexError("example index beyond the fixed set")
        seed = hash((self.data_seed, _SPLIT_SALT[split], length, k, index)) & (2**62 - 1)
        x, y = self._generate(1, length, k, torch.Generator().manual_seed(seed))
        return x[0], y[0]

    def _generate(self, B: int, length: int, K: int, g: torch.Generator
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        V, half, first = self.vocab_size, self.num_keys, int(self.zoology)
        keys = first + torch.rand(B, half - first, generator=g).topk(K, -1).indices  # (B, K) distinct
        if self.zoology:
            values = half + torch.rand(B, V - half, generator=g).topk(K, -1).indices
        else:
            values = torch.randint(half, V, (B, K), generator=g)
        context = torch.stack([keys, values], -1).view(B, 2 * K)
        region = length - 2 * K
        space = region // 2
        weights = torch.arange(1, space + 1, dtype=torch.float64) ** (self.power_a - 1)
        gaps = torch.multinomial(weights.expand(B, space), K, replacement=False, generator=g)
        low = 0 if self.zoology else half
        queries = torch.randint(low, V, (B, region), generator=g).scatter(1, 2 * gaps, keys)
        answers = torch.full((B, region), IGNORE_INDEX).scatter(1, 2 * gaps, values)
        inputs = torch.cat([context, queries], 1)
        labels = torch.cat([torch.full_like(context, IGNORE_INDEX), answers], 1)
        return inputs, labels

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per query, ``seq_acc`` per sequence (every query right)."""
        return accuracy_metrics(logits, labels)
