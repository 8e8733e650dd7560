"""transformers' ``qwen3``: :mod:`.llama`'s dense layout with a per-head RMSNorm on q and k
(the model's RMSNorm, ``rms_norm_eps``), no sliding-window layers."""
from __future__ import annotations

from nas.spec import ArchSpec, NormSpec

from .common import Blocker
from .llama import DENSE_FIELDS, dense_blocker, dense_config, dense_convert, dense_spec

MODEL_TYPE = "qwen3"
ARCHITECTURE = "Qwen3ForCausalLM"


def blocker(arch: ArchSpec) -> Blocker | None:
    return dense_blocker(arch, MODEL_TYPE, NormSpec(eps=arch.model.norm.eps))


def config(arch: ArchSpec) -> dict:
    layers = len(arch.layers)
    return dense_config(arch, MODEL_TYPE, ARCHITECTURE) | {
        "use_sliding_window": False, "layer_types": ["full_attention"] * layers, "max_window_layers": layers}


def architecture(cfg: dict) -> dict:
    rope = cfg.get("rope_parameters") or {}
    return ({k: cfg.get(k) for k in DENSE_FIELDS}
            | {"rope": (rope.get("rope_type"), rope.get("rope_theta"), rope.get("partial_rotary_factor", 1.0)),
               "sliding": bool(cfg.get("use_sliding_window"))})


def to_spec(cfg: dict, name: str) -> ArchSpec:
    return dense_spec(cfg, name, MODEL_TYPE, qk_norm=True)


def convert(arch: ArchSpec, state: dict) -> dict:
    return dense_convert(arch, state, qk_norm=True)


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "config", "convert", "to_spec", "architecture"]
