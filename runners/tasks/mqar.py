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

from runners.tasks.base import (
    IGNORE_INDEX,
    accuracy_metrics,
    check_batch_size,
    register_task,
    split_generator,
)

Settings = tuple[tuple[int, int, int], ...]
# zoology/experiments/mqar_example_configs/original_mqar_configs.py (vocab 8192)
ZOOLOGY_TRAIN: Settings = ((64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000),
                           (256, 32, 20_000), (256, 64, 20_000))
ZOOLOGY_TEST: Settings = ((64, 4, 1_000), (64, 8, 1_000), (64, 16, 1_000), (128, 32, 1_000),
                          (256, 64, 1_000), (512, 128, 1_000), (1024, 256, 1_000))
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
        for field, preset in (("train_settings", ZOOLOGY_TRAIN), ("test_settings", ZOOLOGY_TEST)):
            value = getattr(self, field)
            if isinstance(value, str):
                if value != "zoology":
                    raise ValueError(f"{field} must be 'zoology' or (seq_len, num_kv_pairs, "
                                     f"num_examples) triples, got {value!r}")
                value = preset
            if value is not None:
                value = tuple(tuple(int(x) for x in s) for s in value)
                if not value or any(len(s) != 3 or s[2] < 1 for s in value):
                    raise ValueError(f"{field} must be non-empty (seq_len, num_kv_pairs, "
                                     f"num_examples) triples with num_examples >= 1, got {value}")
                for length, k, _ in value:
                    self._check_setting(length, k, field)
            object.__setattr__(self, field, value)
        if (self.train_settings is None) != (self.test_settings is None):
            raise ValueError("give train_settings and test_settings together (or neither)")
        self._check_setting(self.seq_len, self.num_kv_pairs, "seq_len/num_kv_pairs")
        if self.train_settings and self.seq_len < max(s[0] for s in self.train_settings):
            raise ValueError(f"seq_len ({self.seq_len}) must hold the longest train setting "
                             f"({max(s[0] for s in self.train_settings)})")
        if self.power_a <= 0:
            raise ValueError(f"power_a must be > 0, got {self.power_a}")

    def _check_setting(self, length: int, k: int, field: str) -> None:
        if not 1 <= k <= self.num_keys - int(self.zoology):
            raise ValueError(f"{field}: need 1 <= num_kv_pairs <= {self.num_keys - int(self.zoology)} "
                             f"(the key half of vocab_size={self.vocab_size}), got {k}")
        if length < 4 * k:
            raise ValueError(f"{field}: seq_len must be >= 4 * num_kv_pairs = {4 * k}, got {length}")

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
