"""LT2/MixerLoop residual gate ``h_τ = f(h_{τ-1}) + ρ_τ ⊙ h_{τ-1}``, ρ (m, d) zero-initialised:
one ``rho`` on the model for every region with ``shared: true``, else ``loops.{j}.rho``.
Elementwise: no FLOPs."""
from . import Extra, GraphStep, Rule, register_update


@register_update("residual_gate")
class ResidualGate(Rule):
    def extras(self, r, d, m):
        return (Extra("rho", m * d, shared=r.update.shared),)

    def label(self, r, arch):
        shared = sum(q.update.kind == "residual_gate" and q.update.shared for q in arch.loops)
        return "ρ-gate" + (", shared" if r.update.shared and shared > 1 else "")

    def after(self, r, t):
        return (GraphStep("update", "residual_gate", "rho", "state", r.update.shared),)

    def per_loop_rows(self, r):
        return True
