"""Specs, lowering, validation, execution plans, graphs and costs. Never imports torch."""
from .errors import Problem, SpecError
from .load import dump_yaml, load_arch, load_spec, loads_arch, loads_spec, resolve
from .lower import lower
from .plan import applications, max_loops, plan, unroll
from .spec import (
    ArchSpec, AttnSpec, DeltaNetSpec, DSASpec, ElasticSpec, GDNSpec, KDASpec, LayerSpec,
    LoopRegion, LoopSugar, Mamba2Spec, ModelSpec, MoESpec, NoFFNSpec, NSASpec, OpAddr,
    ParallelSpec, SwiGLUSpec, SwitchSpec,
)
from .validate import validate

__all__ = [
    "ArchSpec", "AttnSpec", "DeltaNetSpec", "DSASpec", "ElasticSpec", "GDNSpec", "KDASpec",
    "LayerSpec", "LoopRegion", "LoopSugar", "Mamba2Spec", "ModelSpec", "MoESpec", "NoFFNSpec",
    "NSASpec", "OpAddr", "ParallelSpec", "SwiGLUSpec", "SwitchSpec", "Problem", "SpecError",
    "applications", "dump_yaml", "load_arch", "load_spec", "loads_arch", "loads_spec", "lower",
    "max_loops", "plan", "resolve", "unroll", "validate",
]
