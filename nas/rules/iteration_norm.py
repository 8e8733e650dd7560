"""A norm after every iteration (Ouro's sandwich norm around the recurrent block): the
updated state is normalised before it enters the next iteration or leaves the loop.
``loops.{j}.norm``: d (rmsnorm) or 2d (layernorm) parameters, elementwise."""
from . import Extra, GraphStep, Rule, register_option


@register_option("iteration_norm", lambda r: r.iteration_norm is not None)
class IterationNorm(Rule):
    def extras(self, r, d, m):
        return (Extra("norm", d * (2 if r.iteration_norm.kind == "layernorm" else 1), 0.0, "iteration"),)

    def label(self, r, arch):
        return "iteration norm"

    def after(self, r, t):
        return (GraphStep("iteration_norm", r.iteration_norm.kind, "norm"),)
