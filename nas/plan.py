"""The execution plan of a canonical spec: which sublayer runs when.

A plan is a tree: a list of :class:`Step` (one sublayer application) and :class:`Loop`
(a region whose body runs ``T`` times). Loop regions nest by containment. The graph,
the cost model and the torch executor all walk this one structure, so they agree on
what "MixerLoop" or "ELR at k loops" means.

``loops=k`` (elastic depth) replaces every region's ``T`` by ``k``.

Everything here is linear in layers + regions (sorting aside), never in the unrolled
depth: :func:`flat_counts` multiplies loop counts over a sweep of region starts and ends,
and only :func:`unroll` visits applications one by one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Union

from .rules import rules_of
from .spec import MAX_APPLICATIONS, ArchSpec, LoopRegion, OpAddr


@dataclass(frozen=True)
class Step:
    addr: OpAddr


@dataclass(frozen=True)
class Loop:
    index: int            # position in ``arch.loops``
    region: LoopRegion
    T: int
    body: tuple["Node", ...] = field(default_factory=tuple)


Node = Union[Step, Loop]


def outer_first(arch: ArchSpec) -> list[int]:
    """Region indices by (start, −end): an enclosing region comes before those inside it."""
    return sorted(range(len(arch.loops)),
                  key=lambda j: (arch.loops[j].start.flat, -arch.loops[j].end.flat))


def plan(arch: ArchSpec, loops: int | None = None) -> tuple[Node, ...]:
    """The plan tree of a canonical spec (regions disjoint or nested), optionally at a
    loop count override. One pass over the sublayers with a stack of open regions."""
    order, k = outer_first(arch), 0
    root: list[Node] = []
    stack: list[tuple[int, list[Node]]] = []  # (region index, its body so far)

    def close() -> None:
        j, body = stack.pop()
        r = arch.loops[j]
        (stack[-1][1] if stack else root).append(Loop(j, r, loops if loops is not None else r.T, tuple(body)))

    for flat in range(2 * len(arch.layers)):
        while stack and arch.loops[stack[-1][0]].end.flat < flat:
            close()
        while k < len(order) and arch.loops[order[k]].start.flat == flat:
            stack.append((order[k], []))
            k += 1
        (stack[-1][1] if stack else root).append(Step(OpAddr(layer=flat // 2, op=("mixer", "ffn")[flat % 2])))
    while stack:
        close()
    return tuple(root)


def unroll(nodes: tuple[Node, ...], path: tuple[tuple[int, int], ...] = ()
           ) -> Iterator[tuple[OpAddr, tuple[tuple[int, int], ...]]]:
    """Every sublayer application in execution order, with its loop path
    ``((loop_index, iteration), ...)`` from outermost to innermost."""
    for n in nodes:
        if isinstance(n, Step):
            yield n.addr, path
        else:
            for t in range(n.T):
                yield from unroll(n.body, path + ((n.index, t),))


_SCHEDULES: dict[int, tuple[tuple, dict[tuple[int, int], list], frozenset[int]]] = {}


def _schedule_index(schedule: tuple) -> tuple[dict[tuple[int, int], list], frozenset[int]]:
    """A region's schedule by (layer, iteration), and the layers it names; built once per
    schedule (LT2's coarse-to-fine has an entry per attention mixer and iteration, and
    every application of every mixer looks its own up)."""
    hit = _SCHEDULES.get(id(schedule))
    if hit is None or hit[0] is not schedule:
        if len(_SCHEDULES) >= 256:  # one sweep prices many candidates: stay bounded
            _SCHEDULES.clear()
        by_key: dict[tuple[int, int], list] = {}
        for o in schedule:
            by_key.setdefault((o.layer, o.iteration), []).append(o)
        hit = _SCHEDULES[id(schedule)] = (schedule, by_key, frozenset(o.layer for o in schedule))
    return hit[1], hit[2]


def schedules_layer(r: LoopRegion, layer: int) -> bool:
    """Whether region ``r``'s schedule has an entry for ``layer``'s mixer."""
    return bool(r.schedule) and layer in _schedule_index(r.schedule)[1]


def iteration_overrides(arch: ArchSpec, layer: int, path) -> dict:
    """The loop-level schedule one application of ``layer``'s mixer runs with, given its
    loop path ``((region index, iteration), ...)`` outermost first: each region's entry for
    (iteration, layer), inner regions winning. ``window`` (``"full"`` lifts the layer's own
    window) and ``topk``. The executor, the graph and the cost model all read this."""
    out: dict = {}
    for r_idx, t in path:
        schedule = arch.loops[r_idx].schedule
        for o in _schedule_index(schedule)[0].get((layer, t), ()) if schedule else ():
            out.update({k: v for k, v in (("window", o.window), ("topk", o.topk)) if v is not None})
    return out


def max_loops(arch: ArchSpec) -> int:
    """Largest loop count any region can run: its T or an elastic train/eval count.
    Sizes per-loop parameters (ρ, conditioning tables)."""
    counts = [r.T for r in arch.loops]
    if arch.elastic is not None:
        counts += list(arch.elastic.train.values) + list(arch.elastic.eval)
    return max(counts, default=1)


def per_loop_rows(arch: ArchSpec) -> bool:
    """Whether the model holds per-iteration parameter rows (ρ, conditioning tables),
    sized by :func:`max_loops`."""
    return any(rule.per_loop_rows(r) for r in arch.loops for rule in rules_of(r))


def loop_count_problem(arch: ArchSpec, loops: int | None) -> str | None:
    """Why a model of ``arch`` cannot run every region ``loops`` times (None: it can).
    The executor and the cost model both ask this, so they allow the same counts."""
    if loops is None:
        return None
    if isinstance(loops, bool) or not isinstance(loops, int) or loops < 1:
        return f"loops={loops!r}: give a loop count >= 1 (or None for each region's T)"
    m = max_loops(arch)
    if loops > m and per_loop_rows(arch):
        return (f"loops={loops} exceeds the {m} rows of this model's per-loop parameters (ρ or "
                f"loop conditioning, sized by the largest T, elastic.train or elastic.eval "
                f"count); add {loops} to elastic.eval in the spec and rebuild to run it")
    total = total_applications(arch, loops)
    if total > MAX_APPLICATIONS:
        return (f"loops={loops} runs {total:,} sublayer applications, over the cap of "
                f"{MAX_APPLICATIONS:,}; use fewer loops")
    return None


def check_loops(arch: ArchSpec, loops: int | None) -> None:
    """Raise ValueError with :func:`loop_count_problem`'s message."""
    problem = loop_count_problem(arch, loops)
    if problem is not None:
        raise ValueError(problem)


def flat_counts(arch: ArchSpec, loops: int | None = None, skip=None) -> list[int]:
    """Applications of each flat sublayer (``2·layer + (0 mixer | 1 ffn)``): the product of
    ``T`` over the regions containing it. A sweep multiplies at each region's start and
    divides after its end (exact: the running value is a product of integers). ``skip(r)``
    leaves region ``r`` out of the product."""
    n = 2 * len(arch.layers)
    start, stop = [1] * (n + 1), [1] * (n + 1)
    for r in arch.loops:
        t = 1 if skip is not None and skip(r) else (r.T if loops is None else loops)
        start[r.start.flat] *= t
        stop[r.end.flat + 1] *= t
    out, cur = [], 1
    for f in range(n):
        cur = cur // stop[f] * start[f]
        out.append(cur)
    return out


def total_applications(arch: ArchSpec, loops: int | None = None) -> int:
    """Sublayer applications in one forward pass."""
    return sum(flat_counts(arch, loops))


def run_counts(arch: ArchSpec) -> tuple[int | None, ...]:
    """Every loop count a model of ``arch`` may run: None (each region's T) and each
    elastic train/eval count."""
    if arch.elastic is None:
        return (None,)
    return (None, *sorted(set(arch.elastic.train.values) | set(arch.elastic.eval)))


def application_cap_problem(arch: ArchSpec) -> str | None:
    """One line when some loop count this spec runs exceeds :data:`MAX_APPLICATIONS`
    sublayer applications per forward pass (the product of nested ``T`` s and depth)."""
    for k in run_counts(arch):
        total = total_applications(arch, k)
        if total > MAX_APPLICATIONS:
            at = "" if k is None else f" at {k} loops"
            size = f"{total:,}" if total < 10**15 else f"about 10^{int(math.log10(total))}"
            return (f"one forward pass{at} runs {size} sublayer applications, over the cap of "
                    f"{MAX_APPLICATIONS:,}; lower T, the nesting or the number of layers")
    return None


def applications(arch: ArchSpec, loops: int | None = None) -> dict[OpAddr, int]:
    """How many times each sublayer runs in one forward pass."""
    return {OpAddr(layer=f // 2, op=("mixer", "ffn")[f % 2]): c
            for f, c in enumerate(flat_counts(arch, loops))}


__all__ = ["Step", "Loop", "Node", "plan", "unroll", "max_loops", "iteration_overrides", "applications", "flat_counts",
           "schedules_layer", "per_loop_rows", "loop_count_problem", "check_loops",
           "total_applications", "run_counts", "application_cap_problem", "outer_first"]
