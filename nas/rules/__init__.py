"""Cross-loop rules, each registered once: what it adds to a loop region's parameters,
what those cost, how the graph draws it and how it is labelled.

A region runs its *update rule* (``region.update``, keyed by the spec's ``kind``: plain,
residual gate, gated step, re-injection) and the *region options* it sets (loop
conditioning, a norm after every iteration), in that order, as :mod:`builders.rules`
executes them (one executor entry per key, with the torch code). Adding a rule is one
module here and one there (plus its spec class in :mod:`nas.spec` when it is an update
rule); nothing else names it.

Per-iteration parameter rows (ρ, conditioning tables) have ``m`` = :func:`nas.plan.max_loops`
rows. FLOPs are matmul FLOPs per token of one run of the rule; ``runs`` says how often it
runs per iteration of its region: ``update`` (every iteration after the first) or
``iteration`` (every iteration).
"""
from __future__ import annotations

from typing import Callable, Literal, NamedTuple

from ..registry import register_once
from ..spec import LoopRegion


class Extra(NamedTuple):
    """One parameter tensor a rule adds: ``name`` under ``loops.{j}.`` (or, ``shared``, the
    model's own, one for every region that asks for it)."""

    name: str
    size: int
    flops: float = 0.0
    runs: Literal["update", "iteration"] = "update"
    shared: bool = False


class GraphStep(NamedTuple):
    """A node the unrolled graph adds around an iteration: ``what`` (``reinject``,
    ``condition``, ``update``, ``norm``), its ``kind``, its parameter group relative to
    ``loops.{j}`` (None: no parameters; ``shared``: the model's own name) and the extra
    edge it reads (``input``: the region input; ``state``: the state before the iteration)."""

    what: str
    kind: str
    group: str | None = None
    edge: Literal["input", "state"] | None = None
    shared: bool = False


class Rule:
    """The spec-side half of one rule. Defaults: no parameters, no graph node, no label."""

    def extras(self, r: LoopRegion, d: int, m: int) -> tuple[Extra, ...]:
        return ()

    def label(self, r: LoopRegion, arch) -> str:
        """A few words for diagrams (``arch``: the whole spec, for rules shared across regions)."""
        return ""

    def before(self, r: LoopRegion, t: int) -> tuple[GraphStep, ...]:
        """Graph nodes between entering iteration ``t`` and its body."""
        return ()

    def after(self, r: LoopRegion, t: int) -> tuple[GraphStep, ...]:
        """Graph nodes after iteration ``t``'s body."""
        return ()

    def per_loop_rows(self, r: LoopRegion) -> bool:
        """Whether the rule holds one parameter row per iteration (sized by max loops)."""
        return False


UPDATES: dict[str, Rule] = {}
OPTIONS: dict[str, tuple[Callable[[LoopRegion], bool], Rule]] = {}


def register_update(kind: str):
    """Register the rule of update-rule spec ``kind`` (once)."""
    return register_once(UPDATES, kind, what="update rule", value=lambda cls: cls())


def register_option(name: str, applies: Callable[[LoopRegion], bool]):
    """Register a region option, run (after the update rule) where ``applies(region)``."""
    return register_once(OPTIONS, name, what="region option", value=lambda cls: (applies, cls()))


def rule_keys(r: LoopRegion) -> tuple[str, ...]:
    """The keys of every rule region ``r`` runs, in execution order (the update rule's
    kind first, then the options it sets); :mod:`builders.rules` uses the same keys."""
    return (r.update.kind, *(name for name, (applies, _) in OPTIONS.items() if applies(r)))


def rules_of(r: LoopRegion) -> tuple[Rule, ...]:
    return (UPDATES[r.update.kind], *(rule for applies, rule in OPTIONS.values() if applies(r)))


from . import conditioning, gated_step, iteration_norm, plain, reinject, residual_gate  # noqa: E402,F401

__all__ = ["Extra", "GraphStep", "Rule", "UPDATES", "OPTIONS", "register_update",
           "register_option", "rule_keys", "rules_of"]
