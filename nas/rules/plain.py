"""Plain composition: ``h_τ = f(h_{τ-1})``. No parameters, no graph node."""
from . import Rule, register_update


@register_update("plain")
class Plain(Rule):
    pass
