"""transformers' ``kimi_linear``: Kimi Delta Attention (KDA) layers and MLA layers, pre-norm,
dense SwiGLU or a sigmoid-routed MoE. loopnas expresses no configuration of it exactly, so
this module only refuses, naming the first field:

- its KDA's output-gate projection ``g_b_proj`` has no bias; loopnas's KDA (fla's
  ``KimiDeltaAttention``) has one (``g_proj.1.bias``), so no loopnas KDA has its function
  and parameter count;
- its ``full_attention`` layers are multi-head latent attention (a compressed, normed KV and
  a rotary part shared by the heads), which loopnas has not;
- its MoE routes with sigmoid scores, a correction bias and a routed scaling factor; loopnas's
  MoE routes with a softmax.
"""
from __future__ import annotations

from nas.spec import ArchSpec, AttnSpec, KDASpec

from .common import Blocker, first, one_of, structural

MODEL_TYPE = "kimi_linear"
ARCHITECTURE = "KimiLinearForCausalLM"
F = MODEL_TYPE
KDA_BIAS = (f"loopnas's KDA (fla's KimiDeltaAttention) biases its output-gate projection (g_proj.1.bias); "
            f"{F}'s g_b_proj has no bias")


def blocker(arch: ArchSpec) -> Blocker:
    if (b := structural(arch, F)) is not None:
        return b
    if (found := one_of(KDASpec, arch)) is not None:
        return Blocker(f"layers[{found[0]}].mixer.kind", f"kda; {KDA_BIAS}")
    if (found := one_of(AttnSpec, arch)) is not None:
        return Blocker(f"layers[{found[0]}].mixer.kind", f"attn; {F}'s attention layers are MLA, which loopnas has not")
    return Blocker("layers[0].mixer.kind", f"{arch.layers[0].mixer.kind}; {F} has KDA and MLA layers only")


def to_spec(cfg: dict, name: str):
    types = list(cfg.get("layer_types") or ())
    reasons = {"linear_attention": KDA_BIAS,
               "full_attention": "its full_attention layers are MLA, which loopnas has not"}
    first_type = next((t for t in types if t in reasons), None)
    raise Blocker("layer_types", f"{first_type!r}; {reasons.get(first_type, 'no layers loopnas maps')}")


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "to_spec"]
