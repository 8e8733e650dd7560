"""The CPU fast paths of the torch backend, and the switch that turns them off.

On by default: q/k/v and gate projections run as one matmul, the three short convolutions
as one, and on CPU a causal depthwise convolution as shifted multiply-adds. Off
(:func:`reference_paths`), every projection is its own ``nn.Linear`` call and every short
convolution a ``conv1d``: the same function (tests/builders/test_ops_linear.py checks the two agree),
in the form a FLOP counter can attribute to modules (tests/builders/test_cost_vs_model.py)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

_ENABLED = True


def enabled() -> bool:
    return _ENABLED


@contextlib.contextmanager
def reference_paths() -> Iterator[None]:
    """Within the block, the plain op-per-module forms instead of the fused fast paths."""
    global _ENABLED
    before, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = before


__all__ = ["enabled", "reference_paths"]
