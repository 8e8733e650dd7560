"""Scale an architecture up for full training: width, head counts and FFN widths together.

The budget matcher (:func:`nas.budget.match_budget`) varies one size. Growing a tiny proxy
to a billion parameters by the width alone leaves its mixers and FFNs at proxy size (a
width-20k residual stream with four 72-dim heads, most parameters in the embedding), and
by the FFN alone gives a 250k-wide FFN. :func:`proportional` multiplies the width and every
size that grows with it by one factor, keeping each head's dimension, the layer pattern
and the loop regions (boundary, ratio, placement, schedules, elastic depth); the budget
matcher then lands the exact target by the FFN width. A spec → spec rewrite in the manner
of ``nas/budget.py``, where it belongs once its owner takes it (as ``vary: scale``).
"""
from __future__ import annotations

from typing import Callable

from nas.budget import match_budget
from nas.cost import unique_params
from nas.errors import SpecError
from nas.lower import lower
from nas.spec import (
    ArchSpec, AttnSpec, DSASpec, GDNSpec, KDASpec, Mamba2Spec, MatchSpec, MoESpec, NSASpec,
    ParallelSpec, SwiGLUSpec, SwitchSpec,
)
from nas.validate import validate

_SCAN = 64  # widths tried past an invalid one


def _n(x: int, s: float) -> int:
    return max(1, round(x * s))


def _op(op, s: float, width: int):
    """One mixer or FFN spec with its width-proportional sizes multiplied by ``s``."""
    if isinstance(op, (ParallelSpec, SwitchSpec)):
        field = "branches" if isinstance(op, ParallelSpec) else "options"
        return op.model_copy(update={field: tuple(_op(b, s, width) for b in getattr(op, field))})
    if isinstance(op, (GDNSpec, KDASpec)):
        heads = _n(op.num_heads, s)
        v = None if op.num_v_heads is None else heads * (op.num_v_heads // op.num_heads)
        return op.model_copy(update={"num_heads": heads, "num_v_heads": v})
    if isinstance(op, (AttnSpec, DSASpec, NSASpec)):
        if op.num_kv_heads is None:
            return op.model_copy(update={"num_heads": _n(op.num_heads, s)})
        kv = _n(op.num_kv_heads, s)
        return op.model_copy(update={"num_kv_heads": kv, "num_heads": kv * (op.num_heads // op.num_kv_heads)})
    if isinstance(op, Mamba2Spec):  # num_heads * head_dim = expand * width
        inner = op.expand * width
        return op.model_copy(update={"num_heads": inner // op.head_dim if inner % op.head_dim == 0 else 0})
    if isinstance(op, SwiGLUSpec):
        return op.model_copy(update={"hidden_size": _n(op.hidden_size, s)})
    if isinstance(op, MoESpec):
        shared = op.shared_expert_hidden and _n(op.shared_expert_hidden, s)
        return op.model_copy(update={"expert_hidden": _n(op.expert_hidden, s), "shared_expert_hidden": shared})
    return op  # deltanet (head dim follows the width), none


def widen(arch: ArchSpec, width: int) -> ArchSpec | None:
    """``arch`` (canonical) at ``width``, every width-proportional size scaled alike; None
    when that gives an invalid spec (a head count that does not divide, ...)."""
    s = width / arch.model.width
    try:
        layers = tuple(l.model_copy(update={"mixer": _op(l.mixer, s, width), "ffn": _op(l.ffn, s, width)})
                       for l in arch.layers)
        out = lower(arch.model_copy(update={"model": arch.model.model_copy(update={"width": width}),
                                            "layers": layers}))
        out = ArchSpec.model_validate(out.model_dump())  # re-check the field constraints
    except (SpecError, ValueError):
        return None
    return None if validate(out) else out


def _grid() -> list[int]:
    """Candidate widths: multiples of 8 up to 1024, then of 64 (the sizes kernels like)."""
    return list(range(8, 1024, 8)) + list(range(1024, (1 << 18) + 1, 64))


def proportional(arch: ArchSpec, target: float, tolerance: float,
                 keep: Callable[[ArchSpec], bool] | None = None) -> ArchSpec:
    """The widened ``arch`` closest to ``target`` unique parameters, landed on it by the
    budget matcher varying the FFN width when the width grid alone misses by more than
    ``tolerance / 2`` (all FFNs then share one hidden size). ``keep``: only widths whose
    spec it accepts count as valid (a native export keeps its transformers family: olmo_hybrid's
    head_dim is hidden_size / num_heads, which a width that the head count does not divide breaks)."""
    grid, memo = _grid(), {}

    def at(i: int) -> tuple[int, ArchSpec] | None:
        if i not in memo:
            a = widen(arch, grid[i])
            memo[i] = None if a is None or (keep is not None and not keep(a)) else (unique_params(a), a)
        return memo[i]

    def valid(i: int, step: int) -> int | None:
        """The first index from ``i`` in direction ``step`` whose width gives a valid spec."""
        for j in range(i, len(grid) if step > 0 else -1, step)[:_SCAN]:
            if at(j) is not None:
                return j
        return None

    lo, hi = 0, len(grid)  # bisect for the first valid width reaching the target
    while lo < hi:
        mid = (lo + hi) // 2
        j = valid(mid, 1)
        if j is None or at(j)[0] >= target:
            hi = mid
        else:
            lo = j + 1
    near = [j for j in (valid(lo, 1), valid(lo - 1, -1) if lo else None) if j is not None]
    if not near:
        raise ValueError(f"no width gives a valid {arch.name} near {target:.6g} unique parameters")
    params, wide = at(min(near, key=lambda j: abs(at(j)[0] - target)))
    if abs(params - target) / target <= tolerance / 2 or not _has_ffn(wide):
        return wide
    matched = match_budget(wide, MatchSpec(unique_params=float(target), vary="ffn_hidden", tolerance=tolerance))
    return matched if keep is None or keep(matched) else wide


def _has_ffn(arch: ArchSpec) -> bool:
    return any(isinstance(l.ffn, (SwiGLUSpec, MoESpec)) for l in arch.layers)


__all__ = ["widen", "proportional"]
