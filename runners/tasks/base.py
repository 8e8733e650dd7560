"""The task protocol, the name registry, and helpers shared by every task family.

A task hands out ``(input_ids, labels)`` batches of shape ``(B, T)``; ``labels[:, t]`` is
the target of the model's logits at position ``t`` (already shifted) and ``IGNORE_INDEX``
where a position is not scored.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, TypeVar, runtime_checkable

import torch

from nas.registry import register_once

IGNORE_INDEX = -100
SPLITS = ("train", "eval")
# Fixed salt, so the eval stream derived from a generator is reproducible.
_EVAL_SALT = 0x2545F4914F6CDD1D


@runtime_checkable
class Task(Protocol):
    """What a proxy trainer consumes."""

    name: str
    vocab_size: int
    seq_len: int

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]: ...


_REGISTRY: dict[str, Callable[..., Task]] = {}
T = TypeVar("T")


def register_task(name: str) -> Callable[[T], T]:
    """Register a task factory under ``name``; registering a name twice raises."""
    return register_once(_REGISTRY, name, what="task")


def task_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_task(name: str, **params: object) -> Task:
    """Build the task registered as ``name`` with keyword ``params``; an unknown
    parameter is a ``ValueError`` naming it, like a bad value."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
    factory = _REGISTRY[name]
    known = {f.name for f in dataclasses.fields(factory)} if dataclasses.is_dataclass(factory) else None
    unknown = sorted(set(params) - known) if known is not None else []
    if unknown:
        raise ValueError(f"task {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters: {', '.join(sorted(known))}")
    return factory(**params)


def split_generator(generator: torch.Generator, split: str) -> torch.Generator:
    """The generator a split draws from.

    ``train`` uses the caller's generator itself. ``eval`` draws one 62-bit number from it
    and seeds a fresh generator with that number xor a salt: a different Mersenne-Twister
    stream, so eval batches are not training batches, yet the same caller seed still
    gives the same eval batches, and successive eval calls differ.
    """
    if split == "train":
        return generator
    if split != "eval":
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    seed = int(torch.randint(0, 2**62, (1,), generator=generator)) ^ _EVAL_SALT
    return torch.Generator().manual_seed(seed)


def accuracy_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Argmax accuracy over scored positions (``acc``) and over whole sequences (``seq_acc``:
    every scored position right; sequences with nothing scored are left out)."""
    scored = labels != IGNORE_INDEX  # (B, T)
    if not scored.any():
        raise ValueError("no scored positions in labels")
    correct = (logits.argmax(-1) == labels) & scored
    seq_ok = (correct | ~scored).all(-1)[scored.any(-1)]
    return {
        "acc": correct.sum().item() / scored.sum().item(),
        "seq_acc": seq_ok.float().mean().item(),
    }


def last_answer_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Argmax accuracy at each sequence's last scored position (rows with none are left out)."""
    scored = labels != IGNORE_INDEX  # (B, T)
    rows = scored.any(-1)
    if not rows.any():
        raise ValueError("no scored positions in labels")
    positions = torch.arange(labels.shape[-1], device=labels.device)
    last = torch.where(scored, positions, -1).amax(-1)[rows]  # (B',)
    picked = logits[rows].argmax(-1).gather(1, last[:, None])[:, 0]
    return (picked == labels[rows].gather(1, last[:, None])[:, 0]).float().mean().item()


def check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
