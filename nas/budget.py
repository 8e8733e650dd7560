"""Budget matching: solve one free size so a spec hits a parameter or compute target.

``match_budget(source, match)`` is the spec → spec rewrite behind a spec's ``match:``
block (``nas.lower.lower`` calls it), and a plain function:

    arch = match_budget(source, MatchSpec(unique_params=20e6, vary="width"))

The free size (``match.vary``) is ``ffn_hidden`` (every SwiGLU ``hidden_size`` and MoE
``expert_hidden``, set to one value), ``width`` or ``num_layers``. Both targets grow with
each of them, so an integer bisection over the sizes that give a valid spec finds the
value closest to the target; sizes whose spec does not lower or validate (a width that
the attention heads do not divide, a layer count an ELR split does not fit) are skipped.
``projection_flops`` is the per-token projection compute at each region's own ``T``.
"""
from __future__ import annotations

from typing import Callable

from .cost import projection_flops, unique_params
from .errors import SpecError, fail
from .lower import lower
from .spec import ArchSpec, MatchSpec, MoESpec, SwiGLUSpec
from .validate import validate

_CAP = {"ffn_hidden": 1 << 22, "width": 1 << 16, "num_layers": 1 << 12}
_SCAN = 1024  # consecutive invalid sizes tried before giving up on a direction

Build = Callable[[int], "ArchSpec | None"]


def _lowered(spec: ArchSpec) -> ArchSpec | None:
    """The canonical form of ``spec``, or None when it does not lower or validate."""
    try:
        arch = lower(spec)
    except SpecError:
        return None
    return None if validate(arch) else arch


def _vary_ffn(source: ArchSpec) -> tuple[Build, int]:
    """Resize every SwiGLU / MoE expert of the lowered spec: no re-lowering per probe."""
    base = lower(source)
    idx = [i for i, l in enumerate(base.layers) if isinstance(l.ffn, (SwiGLUSpec, MoESpec))]
    if not idx:
        raise fail("match.vary", "ffn_hidden needs a swiglu or moe FFN and this spec has none; "
                   "vary width or num_layers")

    def build(h: int) -> ArchSpec:
        layers = list(base.layers)
        for i in idx:
            ffn = layers[i].ffn
            field = "hidden_size" if isinstance(ffn, SwiGLUSpec) else "expert_hidden"
            layers[i] = layers[i].model_copy(update={"ffn": ffn.model_copy(update={field: h})})
        return base.model_copy(update={"layers": tuple(layers)})

    first = base.layers[idx[0]].ffn
    return build, first.hidden_size if isinstance(first, SwiGLUSpec) else first.expert_hidden


def _vary_width(source: ArchSpec) -> tuple[Build, int]:
    def build(w: int) -> ArchSpec | None:
        return _lowered(source.model_copy(update={"model": source.model.model_copy(update={"width": w})}))
    return build, source.model.width


def _vary_layers(source: ArchSpec) -> tuple[Build, int]:
    if source.num_layers is None:
        raise fail("match.vary", "num_layers needs a spec written with num_layers (and layer or "
                   "hybrid), not an explicit layers list; vary ffn_hidden or width")

    def build(n: int) -> ArchSpec | None:
        return _lowered(source.model_copy(update={"num_layers": n}))
    return build, source.num_layers


_VARY = {"ffn_hidden": _vary_ffn, "width": _vary_width, "num_layers": _vary_layers}


class _Search:
    """Memoised probes of a monotone measure over the sizes that give a valid spec."""

    def __init__(self, build: Build, measure: Callable[[ArchSpec], float], cap: int):
        self.build, self.measure, self.cap = build, measure, cap
        self.memo: dict[int, tuple[float, ArchSpec] | None] = {}

    def at(self, x: int) -> tuple[float, ArchSpec] | None:
        if x not in self.memo:
            arch = self.build(x)
            self.memo[x] = None if arch is None else (self.measure(arch), arch)
        return self.memo[x]

    def valid(self, x: int, stop: int, step: int = 1) -> int | None:
        """The first size from x towards ``stop`` (exclusive) that gives a valid spec."""
        for y in range(x, stop, step)[:_SCAN]:
            if self.at(y) is not None:
                return y
        return None

    def value(self, x: int) -> float:
        return self.memo[x][0]


def _bracket(s: _Search, start: int, target: float) -> tuple[int | None, int | None]:
    """Valid sizes lo < hi with value(lo) < target ≤ value(hi); None for a side that no
    valid size reaches."""
    x = s.valid(start, s.cap + 1)
    if x is None:
        x = s.valid(start - 1, 0, -1)
    if x is None:
        return None, None
    if s.value(x) < target:
        lo = x
        while True:
            hi = s.valid(2 * lo, s.cap + 1) if 2 * lo <= s.cap else None
            if hi is None or s.value(hi) >= target:
                return lo, hi
            lo = hi
    hi = x
    while True:
        lo = s.valid(max(1, hi // 2), hi) if hi > 1 else None
        if lo is None or s.value(lo) < target:
            return lo, hi
        hi = lo


def _bisect(s: _Search, lo: int, hi: int, target: float) -> tuple[int, int]:
    while hi - lo > 1:
        mid = (lo + hi) // 2
        x = s.valid(mid, hi)
        if x is None:
            x = s.valid(mid - 1, lo, -1)
        if x is None:
            break
        lo, hi = (x, hi) if s.value(x) < target else (lo, x)
    return lo, hi


def match_budget(source: ArchSpec, match: MatchSpec) -> ArchSpec:
    """The canonical spec whose ``match.vary`` size brings ``unique_params`` or
    ``projection_flops`` (per token) within ``match.tolerance`` (relative) of the target.

    Raises SpecError on ``match.<target>`` when no size reaches the target, on
    ``match.tolerance`` when the closest size misses it, on ``match.vary`` when the spec
    has nothing to vary."""
    field = "unique_params" if match.unique_params is not None else "projection_flops"
    target = float(getattr(match, field))
    measure = unique_params if field == "unique_params" else (lambda a: projection_flops(a).total)
    build, start = _VARY[match.vary](source.model_copy(update={"match": None}))
    s = _Search(build, measure, _CAP[match.vary])
    lo, hi = _bracket(s, start, target)
    if lo is None and hi is None:
        raise fail("match.vary", f"no {match.vary} near {start} gives a valid spec")
    if lo is not None and hi is not None:
        lo, hi = _bisect(s, lo, hi, target)
    best = min((x for x in (lo, hi) if x is not None), key=lambda x: abs(s.value(x) - target))
    value, arch = s.memo[best]
    miss = abs(value - target) / target
    if miss <= match.tolerance:
        return arch
    if hi is None or lo is None:
        edge = "largest" if hi is None else "smallest valid"
        raise fail(f"match.{field}", f"target {target:.6g} is out of reach by varying "
                   f"{match.vary}: the {edge} {match.vary} ({best}) gives {value:.6g}; change "
                   "the other sizes or vary another field")
    raise fail("match.tolerance", f"the closest {match.vary} ({best}) gives {field} = "
               f"{value:.6g}, {miss:.2%} from the target {target:.6g}; loosen tolerance "
               f"(now {match.tolerance}) or vary a finer size")


__all__ = ["match_budget"]
