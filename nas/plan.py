"""The execution plan of a canonical spec: which sublayer runs when.

A plan is a tree: a list of :class:`Step` (one sublayer application) and :class:`Loop`
(a region whose body runs ``T`` times). Loop regions nest by containment. The graph,
the cost model and the torch executor all walk this one structure, so they agree on
what "MixerLoop" or "ELR at k loops" means.

``loops=k`` (elastic depth) replaces every region's ``T`` by ``k``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Union

from .spec import ArchSpec, LoopRegion, OpAddr


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


def _addrs(arch: ArchSpec) -> list[OpAddr]:
    return [OpAddr(layer=i, op=op) for i in range(len(arch.layers)) for op in ("mixer", "ffn")]


def _build(arch: ArchSpec, lo: int, hi: int, regions: list[tuple[int, LoopRegion]],
           loops: int | None) -> tuple[Node, ...]:
    """Nodes for flat sublayers lo..hi (inclusive), given regions inside that span."""
    addrs = _addrs(arch)
    out: list[Node] = []
    flat = lo
    # outermost regions first: sort by start, then widest
    regions = sorted(regions, key=lambda ir: (ir[1].start.flat, -ir[1].end.flat))
    while flat <= hi:
        top = next(((i, r) for i, r in regions if r.start.flat == flat), None)
        if top is None:
            out.append(Step(addrs[flat]))
            flat += 1
            continue
        i, r = top
        inner = [(j, q) for j, q in regions if (j, q) != (i, r)
                 and r.start.flat <= q.start.flat and q.end.flat <= r.end.flat]
        body = _build(arch, r.start.flat, r.end.flat, inner, loops)
        out.append(Loop(i, r, loops if loops is not None else r.T, body))
        regions = [(j, q) for j, q in regions if (j, q) != (i, r) and (j, q) not in inner]
        flat = r.end.flat + 1
    return tuple(out)


def plan(arch: ArchSpec, loops: int | None = None) -> tuple[Node, ...]:
    """The plan tree of a canonical spec, optionally at a loop count override."""
    return _build(arch, 0, 2 * len(arch.layers) - 1, list(enumerate(arch.loops)), loops)


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


def max_loops(arch: ArchSpec) -> int:
    """Largest loop count any region can run: its T or an elastic train/eval count.
    Sizes per-loop parameters (ρ, conditioning tables)."""
    counts = [r.T for r in arch.loops]
    if arch.elastic is not None:
        counts += list(arch.elastic.train.values) + list(arch.elastic.eval)
    return max(counts, default=1)


def applications(arch: ArchSpec, loops: int | None = None) -> dict[OpAddr, int]:
    """How many times each sublayer runs in one forward pass."""
    counts = {a: 0 for a in _addrs(arch)}
    for addr, _ in unroll(plan(arch, loops)):
        counts[addr] += 1
    return counts


__all__ = ["Step", "Loop", "Node", "plan", "unroll", "max_loops", "applications"]
