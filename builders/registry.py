"""Spec type → module builder. Builders receive ``(spec, ctx)`` and never edit the spec."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from torch import Tensor, nn

from nas.registry import register_once

Backend = Literal["torch", "fla"]


@dataclass(frozen=True)
class BuildCtx:
    """What a builder needs besides its own spec."""

    width: int
    backend: Backend = "torch"


_BUILDERS: dict[type, Callable] = {}


def register(spec_type: type) -> Callable:
    """Decorator: ``@register(GDNSpec)`` maps a spec type to its builder (once)."""
    return register_once(_BUILDERS, spec_type, what="a builder for")


def build_op(spec, ctx: BuildCtx) -> nn.Module:
    """The module for one op spec (mixer or FFN)."""
    try:
        builder = _BUILDERS[type(spec)]
    except KeyError:
        raise TypeError(f"no builder registered for {type(spec).__name__}") from None
    return builder(spec, ctx)


def call_op(module: nn.Module, x, **kwargs) -> tuple[Tensor, list[Tensor]]:
    """Run an op: its output and the auxiliary losses of every leaf that ran in it (DSA's
    indexer distillation, inside parallel branches and switch options too), returned
    explicitly rather than left on module attributes, so that they survive activation
    checkpointing and ``torch.compile``. Ops with auxiliary losses set ``returns_aux = True``
    and take ``return_aux=True``; any other op has none."""
    if getattr(module, "returns_aux", False):
        return module(x, return_aux=True, **kwargs)
    return module(x, **kwargs), []


def registered() -> tuple[type, ...]:
    return tuple(_BUILDERS)


__all__ = ["Backend", "BuildCtx", "register", "build_op", "call_op", "registered"]
