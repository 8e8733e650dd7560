"""ELR gated step ``h ← h + g ⊙ (f(h) − h)``, ``g = σ(W [h; f(h)] + b)``, from the second
iteration on: ``gate`` Linear(2d, d) + bias, ``2·(2d² + d)`` FLOPs per token per update
(the bias add counted with the matmul, as the cost model always has)."""
from . import Extra, GraphStep, Rule, register_update


@register_update("gated_step")
class GatedStep(Rule):
    def extras(self, r, d, m):
        return (Extra("gate", 2 * d * d + d, 2.0 * (2 * d * d + d), "update"),)

    def label(self, r, arch):
        return "gated step"

    def after(self, r, t):
        return (GraphStep("update", "gated_step", "gate", "state"),) if t > 0 else ()
