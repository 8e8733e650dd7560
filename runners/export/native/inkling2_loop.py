"""transformers' ``inkling2_loop``, the one looped family: layers
``loop_layer_index_start .. loop_layer_index_end - 1`` (the core) run ``loop_num_passes``
times. loopnas expresses none of it exactly, so this module only refuses, naming the first
field (the loop first, as that is what the family is for):

- a pass does not compose with the one before: every pass restarts from the core's input and
  reads the previous pass only through learned message gates on its q, k, v and MLP inputs,
  which no loopnas update rule (plain, residual gate, gated step, re-injection) is;
- the core must start after at least one prelude layer (``loop_layer_index_start > 0``), so a
  FullLoop over the whole stack has no home at all;
- its layers are not loopnas's: block attention residuals between layers, attention sinks,
  relative-position bias, short convolutions on keys, values and every sublayer output, a
  softcapped sigmoid-routed MoE in every layer, normed embeddings and softcapped logits.
"""
from __future__ import annotations

from nas.spec import ArchSpec

from .common import Blocker

MODEL_TYPE = "inkling2_loop"
ARCHITECTURE = "Inkling2LoopForConditionalGeneration"
F = MODEL_TYPE
LAYERS = (f"{F}'s layers mix earlier blocks through attention residuals and add sinks, relative-position "
          "bias, short convolutions and a softcapped MoE, which loopnas's layers have not")


def _loop(arch: ArchSpec) -> Blocker:
    if len(arch.loops) > 1:
        return Blocker("loops[1]", f"a second loop region; {F} loops one core span")
    r = arch.loops[0]
    if r.start.op != "mixer" or r.end.op != "ffn":
        return Blocker("loops[0].start", f"{r.start} .. {r.end}; {F} loops whole layers")
    if r.start.layer == 0:
        return Blocker("loops[0].start", f"{r.start}; {F}'s core starts after at least one prelude layer "
                                         "(loop_layer_index_start > 0)")
    return Blocker("loops[0].update.kind",
                   f"{r.update.kind}; each {F} pass restarts from the core's input and reads the previous pass "
                   "through message gates on its q, k, v and MLP inputs, which no loopnas update rule is")


def blocker(arch: ArchSpec) -> Blocker:
    if arch.loops:
        return _loop(arch)
    return Blocker("layers[0]", LAYERS)


def to_spec(cfg: dict, name: str):
    raise Blocker("model_type", f"{F}; {LAYERS}, and its passes restart from the core's input (message gates)")


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "to_spec"]
