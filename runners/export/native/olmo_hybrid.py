"""transformers' ``olmo_hybrid``: Gated DeltaNet layers (pre-norm, Llama-style) and softmax
attention layers with OLMo 2's norm placement (post-norm: ``h + norm(attn(h))``,
``h + norm(mlp(h))``) and QK-norm over all heads; plain RMSNorm, dense SwiGLU, full rotary
or none. At least one layer of each kind (its config refuses others).

Weights (``transformers.models.olmo_hybrid``): the GDN keeps fla's separate q/k/v/a/b/g
projections under fla's names and one ``conv1d`` over the concatenated q, k, v channels;
its output norm's eps is fixed at 1e-5.
"""
from __future__ import annotations

from nas.spec import ArchSpec, AttnSpec, GDNSpec, LayerSpec, ModelSpec, NormSpec, SwiGLUSpec

from .common import (
    Blocker, attn_common, base_config, check, first, gdn_common, gdn_conv, gdn_from, gdn_sizes, hidden_act,
    kinds_only, layer_types, model_from, model_norm, norms, one_of, placements, qk_norm_is, rename,
    rope_from, same, shell, structural, swiglu,
)

MODEL_TYPE = "olmo_hybrid"
ARCHITECTURE = "OlmoHybridForCausalLM"
F = MODEL_TYPE
GDN_NORM_EPS = 1e-5  # OlmoHybridGatedDeltaNet.o_norm: fla's FusedRMSNormGated default


def _placement(layer: LayerSpec) -> str:
    return "pre" if isinstance(layer.mixer, GDNSpec) else "post"


def _gdn(arch: ArchSpec) -> Blocker | None:
    i, op = one_of(GDNSpec, arch)
    path = f"layers[{i}].mixer"
    return first([gdn_common(op, path, F),
                  check(f"{path}.norm_eps", op.norm_eps == GDN_NORM_EPS,
                        f"{op.norm_eps:g}; {F}'s GDN output norm has eps {GDN_NORM_EPS:g}")])


def _attn(arch: ArchSpec) -> Blocker | None:
    i, op = one_of(AttnSpec, arch)
    path = f"layers[{i}].mixer"
    return first([attn_common(op, path, F),
                  check(f"{path}.output_gate", not op.output_gate, f"{F}'s attention has no output gate"),
                  check(f"{path}.head_dim", op.head_dim * op.num_heads == arch.model.width,
                        f"{op.head_dim}; {F}'s head_dim is hidden_size / num_heads = "
                        f"{arch.model.width // op.num_heads}"),
                  qk_norm_is(op, path, F, NormSpec(eps=arch.model.norm.eps), over="heads"),
                  check(f"{path}.rope_dim", op.rope_dim in (None, op.head_dim), f"{F}'s rotary is over the whole head")])


def _both_kinds(arch: ArchSpec) -> Blocker | None:
    for kind, name in ((GDNSpec, "Gated DeltaNet"), (AttnSpec, "attention")):
        if one_of(kind, arch) is None:
            return Blocker("layers", f"no {name} layer; {F} needs at least one of each (qwen3_next takes either alone)")
    return None


def blocker(arch: ArchSpec) -> Blocker | None:
    b = first([structural(arch, F), kinds_only(arch, F, (GDNSpec, AttnSpec), (SwiGLUSpec,)), _both_kinds(arch)])
    if b is not None:
        return b
    return first([model_norm(arch, F, zero_centered=False), placements(arch, F, _placement),
                  *(same(arch, F, which, kind) for which, kind in
                    (("mixer", GDNSpec), ("mixer", AttnSpec), ("ffn", SwiGLUSpec))),
                  _gdn(arch), _attn(arch)])


def config(arch: ArchSpec) -> dict:
    attn, gdn, ffn = one_of(AttnSpec, arch)[1], one_of(GDNSpec, arch)[1], arch.layers[0].ffn
    out = base_config(arch, MODEL_TYPE, ARCHITECTURE)
    rope = {"rope_type": "default", "rope_theta": attn.rope_theta}  # rope_theta None: NoPE
    out.update(layer_types=["linear_attention" if isinstance(l.mixer, GDNSpec) else "full_attention"
                            for l in arch.layers],
               num_attention_heads=attn.num_heads, num_key_value_heads=attn.num_kv_heads or attn.num_heads,
               attention_bias=False, rope_parameters=rope, intermediate_size=ffn.hidden_size,
               linear_allow_neg_eigval=gdn.allow_neg_eigval, **gdn_sizes(gdn))
    return out


def architecture(cfg: dict) -> dict:
    rope = cfg.get("rope_parameters") or {}
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "rms_norm_eps", "tie_word_embeddings",
            "hidden_act", "layer_types", "num_attention_heads", "num_key_value_heads", "attention_bias",
            "intermediate_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "linear_allow_neg_eigval")
    return {k: cfg.get(k) for k in keys} | {"rope": (rope.get("rope_type"), rope.get("rope_theta"))}


def to_spec(cfg: dict, name: str) -> ArchSpec:
    hidden_act(cfg)
    types, eps = layer_types(cfg), cfg.get("rms_norm_eps", 1e-6)
    if cfg.get("attention_bias"):
        raise Blocker("attention_bias", "true; loopnas attention has no o_proj bias")
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg["hidden_size"] // heads
    rope = rope_from(cfg, hd) if cfg.get("rope_parameters") is not None else {"rope_theta": None}
    attn = AttnSpec(num_heads=heads, num_kv_heads=None if kv == heads else kv, head_dim=hd,
                    qk_norm=NormSpec(eps=eps), qk_norm_over="heads", **rope)
    gdn = gdn_from(cfg, norm_eps=GDN_NORM_EPS, allow_neg_eigval=bool(cfg.get("linear_allow_neg_eigval", True)))
    ffn = SwiGLUSpec(hidden_size=cfg["intermediate_size"])
    layers = tuple(LayerSpec(mixer=gdn, ffn=ffn) if t == "linear_attention"
                   else LayerSpec(mixer=attn, ffn=ffn, norm_placement="post") for t in types)
    return ArchSpec(name=name, description=f"Imported from an {MODEL_TYPE} config.",
                    model=ModelSpec(**model_from(cfg)), layers=layers)


def convert(arch: ArchSpec, state: dict) -> dict:
    out = shell(arch, state)
    for i, layer in enumerate(arch.layers):
        src, dst = f"layers.{i}.mixer", f"model.layers.{i}"
        if isinstance(layer.mixer, GDNSpec):
            out |= norms(state, i, "input_layernorm", "post_attention_layernorm")
            names = ("q_proj", "k_proj", "v_proj", "a_proj", "b_proj", "g_proj", "o_proj", "o_norm")
            out |= rename(state, [(f"{src}.{n}.weight", f"{dst}.linear_attn.{n}.weight") for n in names]
                          + [(f"{src}.{n}", f"{dst}.linear_attn.{n}") for n in ("A_log", "dt_bias")])
            out[f"{dst}.linear_attn.conv1d.weight"] = gdn_conv(state, src)
        else:
            out |= norms(state, i, "post_attention_layernorm", "post_feedforward_layernorm")
            out |= rename(state, ((f"{src}.{n}.weight", f"{dst}.self_attn.{n}.weight")
                                  for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")))
        out |= swiglu(state, f"layers.{i}.ffn", f"{dst}.mlp")
    return out


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "config", "convert", "to_spec", "architecture"]
