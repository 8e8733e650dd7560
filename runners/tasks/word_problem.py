"""Permutation word problems (registered as ``s5``): the running product of group elements.

Why this probe rather than selective copying: selective copying tests content-based
filtering, a recall skill that a single pass of attention or a selective SSM already
has, so looping adds little. The S_5 word problem is the canonical task where depth is
the bottleneck: it is NC^1-complete (Barrington), so fixed-depth transformers (TC^0)
cannot solve it at every length unless TC^0 = NC^1, and a single diagonal-plus-rank-1
linear-attention block cannot either at finite precision (Grazzi et al., LT2 ref. [27]).
LT2 §2.2 argues that T loops turn a rank-1 state update into a rank-T one (DeltaProduct,
ref. [57]), which is exactly what S_n needs; this probe isolates that claim from recall,
which ``state_tracking`` mixes in.

Format: ``seq_len`` tokens ``g_1 ... g_T``, each a uniform element of S_degree (token id =
its index in lexicographic order, so id 0 is the identity). The label at position t is
the running product ``s_t = g_t ∘ ... ∘ g_1`` (``g_1`` applied first), scored at every
position. ``vocab_size = degree!``, shared by inputs and labels.

Chance: every ``s_t`` is uniform over the group, so a constant guesser scores ``1/degree!``
(1/120 for S_5).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import torch

from nas.proxy import check_s5
from runners.tasks.base import accuracy_metrics, check_batch_size, register_task, split_generator


@lru_cache(maxsize=None)
def permutation_table(degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perms, compose)``: ``perms[i]`` is the i-th permutation of ``0..degree-1`` in
    lexicographic order, (N, degree); ``compose[a, b]`` is the index of ``a ∘ b``
    (``x -> perms[a][perms[b][x]]``), (N, N)."""
    perms = torch.tensor(list(itertools.permutations(range(degree))))  # (N, d)
    n = perms.shape[0]
    place = degree ** torch.arange(degree)  # base-degree code of a permutation
    lookup = torch.full((degree**degree,), -1, dtype=torch.long)
    lookup[(perms * place).sum(-1)] = torch.arange(n)
    composed = perms[:, None, :].expand(n, n, degree).gather(2, perms[None].expand(n, n, degree))
    return perms, lookup[(composed * place).sum(-1)]


@register_task("s5")
@dataclass(frozen=True)
class PermutationWordProblem:
    """The S_degree word problem; see the module docstring."""

    seq_len: int = 64
    degree: int = 5
    name: ClassVar[str] = "s5"

    def __post_init__(self) -> None:
        check_s5(self.seq_len, self.degree)

    @property
    def vocab_size(self) -> int:
        return math.factorial(self.degree)

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        _, compose = permutation_table(self.degree)
        inputs = torch.randint(0, self.vocab_size, (batch_size, self.seq_len), generator=g)
        prefix = inputs.clone()
        # Hillis-Steele scan: after the pass with this shift, prefix[t] is the product of
        # g over (t - 2 * shift, t]; later factors compose on the left.
        shift = 1
        while shift < self.seq_len:
            later, earlier = prefix[:, shift:], prefix[:, :-shift]
            prefix = torch.cat([prefix[:, :shift], compose[later, earlier]], 1)
            shift *= 2
        return inputs, prefix

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """``acc`` per position, ``seq_acc`` per sequence (every prefix right)."""
        return accuracy_metrics(logits, labels)
