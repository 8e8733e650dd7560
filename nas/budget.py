"""Budget matching: solve one free size so a spec hits a parameter or compute target.

``match_budget(source, match)`` is the spec → spec rewrite behind a spec's ``match:``
block (``nas.load.resolve`` calls it), and a plain function:

    arch = match_budget(source, MatchSpec(unique_params=20e6, vary="width"))

The free size (``match.vary``) is ``ffn_hidden`` (every SwiGLU ``hidden_size`` and MoE
``expert_hidden``, set to one value), ``width``, ``num_layers``, or ``scale``. Both targets
grow with each of them, so an integer bisection over the sizes that give a valid spec finds
the value closest to the target; sizes whose spec does not lower or validate (a width that
the attention heads do not divide, a layer count an ELR split does not fit) are skipped.
``projection_flops`` is the per-token projection compute at each region's own ``T``.

``scale`` grows the model proportionally (:func:`scale_arch`): the width, every head count
and every FFN / expert width by one factor, each head's dimension, the layer pattern and the
loop regions kept. Varying the width alone leaves a proxy's mixers and FFNs at proxy size,
the FFN alone gives a 250k-wide FFN at a billion parameters. The factor is solved over
kernel-friendly widths (multiples of 8 to 1024, then of 64) and the FFN width lands the
exact target (:func:`scale_to_params`; export's ``--scale-to`` is this rule).
"""
from __future__ import annotations

import math
from typing import Callable

from .cost import projection_flops, unique_params
from .errors import Problem, SpecError, fail
from .lower import lower
from .spec import (
    ArchSpec, AttnSpec, DeltaNetSpec, DSASpec, GDNSpec, KDASpec, Mamba2Spec, MatchSpec, MoESpec,
    NSASpec, ParallelSpec, SwiGLUSpec, SwitchSpec,
)
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


def _measure(field: str) -> Callable[[ArchSpec], float]:
    return unique_params if field == "unique_params" else (lambda a: projection_flops(a).total)


def match_budget(source: ArchSpec, match: MatchSpec) -> ArchSpec:
    """The canonical spec whose ``match.vary`` size brings ``unique_params`` or
    ``projection_flops`` (per token) within ``match.tolerance`` (relative) of the target.

    Raises SpecError on ``match.<target>`` when no size reaches the target, on
    ``match.tolerance`` when the closest size misses it, on ``match.vary`` when the spec
    has nothing to vary."""
    field = "unique_params" if match.unique_params is not None else "projection_flops"
    target = float(getattr(match, field))
    measure = _measure(field)
    if match.vary == "scale":
        return _scale_match(source.model_copy(update={"match": None}), field, target, match.tolerance)
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


SCALE_TOLERANCE = 0.02
"""How close :func:`scale_to_params` lands (export's ``--scale-to``)."""
_NEAR = 64  # widths tried on each side of a factor's own width, or past an invalid grid width


def _times(x: int, s: float) -> int:
    return max(1, round(x * s))


def _grown(op, s: float, width: int):
    """One mixer or FFN spec with its width-proportional sizes multiplied by ``s``: head
    counts (each head keeps its dimension; a GQA group and a value-head multiple keep their
    ratio), FFN and expert widths. A DSA indexer's heads and top-k are kept: they pick keys,
    they do not carry the residual stream."""
    if isinstance(op, (ParallelSpec, SwitchSpec)):
        field = "branches" if isinstance(op, ParallelSpec) else "options"
        return op.model_copy(update={field: tuple(_grown(b, s, width) for b in getattr(op, field))})
    if isinstance(op, (GDNSpec, KDASpec)):
        heads = _times(op.num_heads, s)
        v = None if op.num_v_heads is None else heads * (op.num_v_heads // op.num_heads)
        return op.model_copy(update={"num_heads": heads, "num_v_heads": v})
    if isinstance(op, (AttnSpec, DSASpec, NSASpec)):
        if op.num_kv_heads is None:
            return op.model_copy(update={"num_heads": _times(op.num_heads, s)})
        kv = _times(op.num_kv_heads, s)
        return op.model_copy(update={"num_kv_heads": kv, "num_heads": kv * (op.num_heads // op.num_kv_heads)})
    if isinstance(op, DeltaNetSpec):  # head dim = width * expand_k / num_heads
        return op.model_copy(update={"num_heads": _times(op.num_heads, s)})
    if isinstance(op, Mamba2Spec):  # num_heads * head_dim = expand * width
        inner = op.expand * width
        return op.model_copy(update={"num_heads": inner // op.head_dim if inner % op.head_dim == 0 else 0})
    if isinstance(op, SwiGLUSpec):
        return op.model_copy(update={"hidden_size": _times(op.hidden_size, s)})
    if isinstance(op, MoESpec):
        shared = op.shared_expert_hidden and _times(op.shared_expert_hidden, s)
        return op.model_copy(update={"expert_hidden": _times(op.expert_hidden, s), "shared_expert_hidden": shared})
    return op  # no FFN


def widen(arch: ArchSpec, width: int) -> ArchSpec | None:
    """``arch`` (canonical) at ``width``, every width-proportional size scaled by
    ``width / arch.model.width`` (:func:`_grown`); None when that gives an invalid spec
    (a head count the width does not divide, ...)."""
    s = width / arch.model.width
    try:
        layers = tuple(l.model_copy(update={"mixer": _grown(l.mixer, s, width), "ffn": _grown(l.ffn, s, width)})
                       for l in arch.layers)
        out = lower(arch.model_copy(update={"model": arch.model.model_copy(update={"width": width}),
                                            "layers": layers}))
        out = ArchSpec.model_validate(out.model_dump())  # re-check the field constraints
    except (SpecError, ValueError):
        return None
    return None if validate(out) else out


def _canonical(arch: ArchSpec) -> ArchSpec:
    """Lower, validate, match (``nas.load.resolve``, which imports this module)."""
    canonical = lower(arch)
    problems = validate(canonical)
    if problems:
        raise SpecError(problems)
    return canonical if arch.match is None else match_budget(arch, arch.match)


def scale_arch(arch: ArchSpec, factor: float) -> ArchSpec:
    """``arch`` (canonical or user-level) with width, every head count and every FFN /
    expert width multiplied by ``factor`` (head dims, layer pattern, loop regions, update
    rules, schedules kept); factor 1 returns the canonical form of ``arch`` unchanged.

    The width is ``round(width * factor)``, or the nearest width to it (up to 64 either
    side) that gives a valid spec; the other sizes follow the width's own multiple, so a
    factor of 2 doubles every one exactly. Raises SpecError naming the factor when no valid
    spec exists near it."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        raise fail("factor", f"{factor!r} is not a scale factor; give a finite number > 0 (2 doubles the width)")
    base = _canonical(arch)
    if factor == 1:
        return base
    aim = base.model.width * factor
    centre = max(1, round(aim))
    for width in sorted(range(max(1, centre - _NEAR), centre + _NEAR + 1), key=lambda w: (abs(w - aim), w)):
        if width <= _CAP["width"] and (out := widen(base, width)) is not None:
            return out
    raise fail("factor", f"no width near {aim:.6g} ({base.name}'s {base.model.width} × {factor:g}) gives a "
                         "valid spec; pick another factor")


def _grid() -> list[int]:
    """Candidate widths: multiples of 8 up to 1024, then of 64 (the sizes kernels like)."""
    return list(range(8, 1024, 8)) + list(range(1024, (1 << 18) + 1, 64))


def grow(arch: ArchSpec, target: float, tolerance: float, field: str = "unique_params",
         keep: Callable[[ArchSpec], bool] | None = None) -> ArchSpec:
    """The widened canonical ``arch`` (:func:`widen`) closest to ``target`` (``field``:
    ``unique_params`` or ``projection_flops``), landed on it by the budget matcher varying
    the FFN width when the width grid alone misses by more than ``tolerance / 2`` (all FFNs
    then share one hidden size). It may still miss when the spec has no FFN: callers check.
    ``keep``: only widths whose spec it accepts count as valid (a native export keeps its
    transformers family). Raises SpecError on ``field`` when no grid width is valid."""
    grid, memo, measure = _grid(), {}, _measure(field)

    def at(i: int) -> tuple[float, ArchSpec] | None:
        if i not in memo:
            a = widen(arch, grid[i])
            memo[i] = None if a is None or (keep is not None and not keep(a)) else (measure(a), a)
        return memo[i]

    def valid(i: int, step: int) -> int | None:
        """The first index from ``i`` in direction ``step`` whose width gives a valid spec."""
        for j in range(i, len(grid) if step > 0 else -1, step)[:_NEAR]:
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
        raise fail(field, f"no width gives a valid {arch.name} near {target:.6g} {_WORDS[field]}")
    value, wide = at(min(near, key=lambda j: abs(at(j)[0] - target)))
    if abs(value - target) / target <= tolerance / 2 or not _has_ffn(wide):
        return wide
    try:
        matched = match_budget(wide, MatchSpec(**{field: float(target)}, vary="ffn_hidden", tolerance=tolerance))
    except SpecError as exc:
        if exc.problems[0].path != f"match.{field}":
            raise
        raise fail(field, f"{target:.6g} {_WORDS[field]} is out of reach of {arch.name} grown in proportion: "
                          f"the nearest width ({wide.model.width}) gives {value:.6g}, and no FFN width closes "
                          f"the gap; give a {'larger' if value > target else 'smaller'} target") from None
    return matched if keep is None or keep(matched) else wide


_WORDS = {"unique_params": "unique parameters", "projection_flops": "projection FLOPs per token"}


def _has_ffn(arch: ArchSpec) -> bool:
    return any(isinstance(l.ffn, (SwiGLUSpec, MoESpec)) for l in arch.layers)


def _landed(arch: ArchSpec, field: str, target: float, tolerance: float, path: str, fix: str) -> ArchSpec:
    value = _measure(field)(arch)
    miss = abs(value - target) / target
    if miss > tolerance:
        raise fail(path, f"scaling gets no closer than {value:.6g}, {miss:.2%} from the target "
                         f"{target:.6g}, and the spec has no FFN width to land it; {fix}")
    return arch


def _scale_match(source: ArchSpec, field: str, target: float, tolerance: float) -> ArchSpec:
    try:
        arch = grow(lower(source), target, tolerance, field)
    except SpecError as exc:
        raise SpecError([p if p.path.startswith("match.") else Problem(f"match.{p.path}", p.message)
                         for p in exc.problems]) from None
    return _landed(arch, field, target, tolerance, "match.tolerance",
                   f"loosen tolerance (now {tolerance}) or vary width")


def scale_to_params(arch: ArchSpec, unique_params: float, *, tolerance: float = SCALE_TOLERANCE) -> ArchSpec:
    """``arch`` (canonical or user-level) grown or shrunk proportionally (:func:`scale_arch`'s
    rule) to the grid width nearest ``unique_params``, then the budget matcher lands the
    exact target by the FFN width: within ``tolerance`` (relative; 2%, what export's
    ``--scale-to`` does). Raises SpecError on ``unique_params`` for a target that is not a
    finite number > 0, that no width reaches or that a spec without FFN misses."""
    if isinstance(unique_params, bool) or not isinstance(unique_params, (int, float)) or not (
            math.isfinite(unique_params) and unique_params > 0):
        raise fail("unique_params", f"{unique_params!r} is not a parameter count; give a finite number > 0")
    target = float(unique_params)
    return _landed(grow(_canonical(arch), target, tolerance), "unique_params", target, tolerance,
                   "unique_params", "give a width multiple (scale_arch) instead")


__all__ = ["match_budget", "scale_arch", "scale_to_params", "grow", "widen", "SCALE_TOLERANCE"]
