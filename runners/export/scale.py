"""Export's ``--scale-to`` rule, which lives in :mod:`nas.budget` (``vary: scale``): width,
head counts and FFN widths grown together, then the FFN width lands the target. Kept as
the names export calls."""
from __future__ import annotations

from typing import Callable

from nas.budget import grow, widen
from nas.errors import SpecError
from nas.spec import ArchSpec


def proportional(arch: ArchSpec, target: float, tolerance: float,
                 keep: Callable[[ArchSpec], bool] | None = None) -> ArchSpec:
    """:func:`nas.budget.grow` on unique parameters; ValueError when no width gives a valid
    spec. ``keep``: only widths whose spec it accepts count (a native export keeps its
    transformers family)."""
    try:
        return grow(arch, target, tolerance, keep=keep)
    except SpecError as exc:
        if exc.problems[0].path == "unique_params":
            raise ValueError(exc.problems[0].message) from None
        raise


__all__ = ["widen", "proportional"]
