"""Plain composition: the iteration's output is the new state."""
from . import LoopRule, register


@register("plain")
class Plain(LoopRule):
    pass
