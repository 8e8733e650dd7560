"""Spec rewrite: a looped spec → its explicitly unrolled, loop-free twin.

Every sublayer application of the plan becomes its own physical sublayer, so the twin
computes what the looped model computes under plain composition once the twin's weights
are tied back to the looped ones (``tie_map`` says which). A mixer application not
followed by its own layer's FFN becomes a layer with ``ffn: none``.
"""
from __future__ import annotations

from .errors import fail
from .plan import plan, unroll
from .spec import ArchSpec, LayerSpec, NoFFNSpec


def unrolled_twin(arch: ArchSpec, loops: int | None = None) -> tuple[ArchSpec, list[int]]:
    """The loop-free twin and, for each of its layers, the source layer index."""
    apps = [addr for addr, _ in unroll(plan(arch, loops))]
    layers, sources, i = [], [], 0
    while i < len(apps):
        a = apps[i]
        if a.op != "mixer":
            raise fail("loops", f"{a} runs without its layer's mixer before it; an unrolled "
                       "twin needs every FFN application to follow its own mixer")
        src = arch.layers[a.layer]
        paired = i + 1 < len(apps) and apps[i + 1].op == "ffn" and apps[i + 1].layer == a.layer
        layers.append(LayerSpec(mixer=src.mixer, ffn=src.ffn if paired else NoFFNSpec(),
                                norm_placement=src.norm_placement))
        sources.append(a.layer)
        i += 2 if paired else 1
    twin = arch.model_copy(update={"name": f"{arch.name}_unrolled", "layers": tuple(layers),
                                   "loops": (), "elastic": None})
    return twin, sources


__all__ = ["unrolled_twin"]
