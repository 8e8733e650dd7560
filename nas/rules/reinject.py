"""Huginn/Parcae input re-injection of the region input ``e``: ``add`` ``h + e``;
``concat`` ``W [h; e]`` (``reinject`` Linear(2d, d), ``2·2d²`` FLOPs per token per run);
``diagonal`` ``a ⊙ h + b ⊙ e`` (``reinject_a``, ``reinject_b``: d each, elementwise).

With ``initial_state: input`` the first iteration reads ``e`` itself and re-injection runs
from the second iteration on; with ``zeros`` or ``random`` (Huginn: s₀ ~ N(0, σ²)) the
state starts there and re-injection runs before every iteration."""
from . import Extra, GraphStep, Rule, register_update


def every_iteration(r) -> bool:
    return r.update.initial_state != "input"


@register_update("reinject")
class Reinject(Rule):
    def extras(self, r, d, m):
        runs = "iteration" if every_iteration(r) else "update"
        if r.update.mode == "concat":
            return (Extra("reinject", 2 * d * d, 4.0 * d * d, runs),)
        if r.update.mode == "diagonal":
            return (Extra("reinject_a", d), Extra("reinject_b", d))
        return ()

    def label(self, r, arch):
        start = {"zeros": ", from s₀ = 0", "random": ", from random s₀"}.get(r.update.initial_state, "")
        return f"re-inject {r.update.mode}{start}"

    def before(self, r, t):
        if t == 0 and not every_iteration(r):
            return ()
        group = None if r.update.mode == "add" else "reinject"
        return (GraphStep("reinject", f"reinject_{r.update.mode}", group, "input"),)
