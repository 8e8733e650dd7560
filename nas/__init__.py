"""Specs, lowering, validation, execution plans, graphs and costs. Never imports torch."""
from .budget import match_budget, scale_arch, scale_to_params
from .cost import CostSheet, projection_flops, unique_params
from .errors import Problem, SpecError
from .graph import folded_graph, graph_problems, to_dot, to_mermaid, unrolled_graph
from .load import dump_yaml, load_arch, load_spec, loads_arch, loads_spec, resolve
from .lower import lower
from .plan import applications, max_loops, plan, unroll
from .spec import (
    ArchSpec, AttnSpec, DeltaNetSpec, DSASpec, ElasticSpec, GDNSpec, KDASpec, LayerSpec,
    LoopRegion, LoopSugar, Mamba2Spec, ModelSpec, MoESpec, NoFFNSpec, NSASpec, OpAddr,
    ParallelSpec, SwiGLUSpec, SwitchSpec,
)
from .twin import unrolled_twin
from .validate import validate

__all__ = [
    "ArchSpec", "AttnSpec", "DeltaNetSpec", "DSASpec", "ElasticSpec", "GDNSpec", "KDASpec",
    "LayerSpec", "LoopRegion", "LoopSugar", "Mamba2Spec", "ModelSpec", "MoESpec", "NoFFNSpec",
    "NSASpec", "OpAddr", "ParallelSpec", "SwiGLUSpec", "SwitchSpec", "Problem", "SpecError",
    "applications", "dump_yaml", "load_arch", "load_spec", "loads_arch", "loads_spec", "lower",
    "max_loops", "plan", "resolve", "unroll", "validate", "CostSheet", "projection_flops",
    "unique_params", "match_budget", "scale_arch", "scale_to_params", "folded_graph", "graph_problems", "to_dot", "to_mermaid",
    "unrolled_graph", "unrolled_twin",
]
