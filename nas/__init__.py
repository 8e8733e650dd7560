"""Specs, lowering, validation, execution plans, graphs and costs. Never imports torch.

The names below load on first use (PEP 562), so ``import nas.errors`` (every command line,
``loopnas status``) does not pay for pydantic models, the cost model or networkx.
``nas.plan``, ``nas.lower`` and ``nas.validate`` are the functions, as they always were
(their modules: ``from nas.plan import ...``)."""
from __future__ import annotations

import importlib
import sys
import types

_WHERE = {
    "match_budget": "budget", "scale_arch": "budget", "scale_to_params": "budget",
    "CostSheet": "cost", "projection_flops": "cost", "unique_params": "cost",
    "Problem": "errors", "SpecError": "errors",
    "folded_graph": "graph", "graph_problems": "graph", "to_dot": "graph", "to_mermaid": "graph",
    "unrolled_graph": "graph",
    "dump_yaml": "load", "load_arch": "load", "load_spec": "load", "loads_arch": "load", "loads_spec": "load",
    "resolve": "load",
    "lower": "lower",
    "applications": "plan", "max_loops": "plan", "plan": "plan", "unroll": "plan",
    **{name: "spec" for name in (
        "ArchSpec", "AttnSpec", "DeltaNetSpec", "DSASpec", "ElasticSpec", "GDNSpec", "KDASpec", "LayerSpec",
        "LoopRegion", "LoopSugar", "Mamba2Spec", "ModelSpec", "MoESpec", "NoFFNSpec", "NSASpec", "OpAddr",
        "ParallelSpec", "SwiGLUSpec", "SwitchSpec")},
    "unrolled_twin": "twin",
    "validate": "validate",
}
_SHADOWED = ("lower", "plan", "validate")  # a function named as its module: the name means the function

__all__ = [
    "ArchSpec", "AttnSpec", "DeltaNetSpec", "DSASpec", "ElasticSpec", "GDNSpec", "KDASpec",
    "LayerSpec", "LoopRegion", "LoopSugar", "Mamba2Spec", "ModelSpec", "MoESpec", "NoFFNSpec",
    "NSASpec", "OpAddr", "ParallelSpec", "SwiGLUSpec", "SwitchSpec", "Problem", "SpecError",
    "applications", "dump_yaml", "load_arch", "load_spec", "loads_arch", "loads_spec", "lower",
    "max_loops", "plan", "resolve", "unroll", "validate", "CostSheet", "projection_flops",
    "unique_params", "match_budget", "scale_arch", "scale_to_params", "folded_graph", "graph_problems", "to_dot", "to_mermaid",
    "unrolled_graph", "unrolled_twin",
]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Keeps ``nas.plan``/``nas.lower``/``nas.validate`` the functions when the import system
    records the submodule of that name on the package (its setattr is ignored)."""


_SET: dict = {}


def _shadowed(name: str) -> property:
    def get(self):
        if name in _SET:
            return _SET[name]
        return getattr(importlib.import_module(f"{__name__}.{name}"), name)

    def set(self, value):  # the import system recording the submodule (sys.modules has it): ignored
        if not isinstance(value, types.ModuleType):
            _SET[name] = value  # a test's monkeypatch

    return property(get, set)


for _name in _SHADOWED:
    setattr(_Package, _name, _shadowed(_name))
sys.modules[__name__].__class__ = _Package
del _name
