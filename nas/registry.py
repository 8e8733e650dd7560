"""The one register-once decorator behind every registry of the house: the cross-loop rules
(:mod:`nas.rules`) and their executors (:mod:`builders.rules`), the per-op cost rules
(:mod:`nas.cost.ops`), the op builders (:mod:`builders.registry`) and the proxy tasks
(:mod:`runners.tasks`). Each keeps its own plain ``dict``; this only fills it."""
from __future__ import annotations

from collections.abc import Callable, Hashable, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")


def register_once(table: MutableMapping[Any, Any], *keys: Hashable, what: str,
                  value: Callable[[Any], Any] | None = None) -> Callable[[T], T]:
    """A decorator that files ``value(obj)`` (default: ``obj`` itself) in ``table`` under each
    of ``keys`` and returns ``obj`` unchanged. A key already in ``table`` raises ValueError
    naming ``what`` and the key, before anything is filed."""

    def deco(obj: T) -> T:
        for key in keys:
            if key in table:
                name = key.__name__ if isinstance(key, type) else repr(key)
                raise ValueError(f"{what} {name} is already registered (each key is registered once)")
        entry = obj if value is None else value(obj)
        for key in keys:
            table[key] = entry
        return obj

    return deco


__all__ = ["register_once"]
