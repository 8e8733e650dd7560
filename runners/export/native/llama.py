"""transformers' ``llama``: pre-norm softmax attention (GQA, full rotary, no q/k norm) and
SwiGLU in every layer, plain RMSNorm. :mod:`.qwen3` is the same with per-head q/k RMSNorm."""
from __future__ import annotations

from nas.spec import ArchSpec, AttnSpec, LayerSpec, ModelSpec, NormSpec, SwiGLUSpec

from .common import (
    Blocker, attn_common, base_config, check, first, hidden_act, kinds_only, layer_types, model_from,
    model_norm, norms, one_of, placements, qk_norm_is, rename, rope_from, same, shell, structural, swiglu,
)

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"


def dense_blocker(arch: ArchSpec, family: str, qk_norm: NormSpec | None) -> Blocker | None:
    b = first([structural(arch, family), kinds_only(arch, family, (AttnSpec,), (SwiGLUSpec,)),
               model_norm(arch, family, zero_centered=False), placements(arch, family, lambda layer: "pre"),
               same(arch, family, "mixer", AttnSpec), same(arch, family, "ffn", SwiGLUSpec)])
    if b is not None:
        return b
    i, op = one_of(AttnSpec, arch)
    path = f"layers[{i}].mixer"
    return first([attn_common(op, path, family),
                  check(f"{path}.output_gate", not op.output_gate, f"{family}'s attention has no output gate"),
                  qk_norm_is(op, path, family, qk_norm),
                  check(f"{path}.rope_theta", op.rope_theta is not None, f"{family} always applies rotary embeddings"),
                  check(f"{path}.rope_dim", op.rope_dim in (None, op.head_dim), f"{family}'s rotary is over the whole head")])


def blocker(arch: ArchSpec) -> Blocker | None:
    return dense_blocker(arch, MODEL_TYPE, None)


def dense_config(arch: ArchSpec, model_type: str, architecture: str) -> dict:
    op = arch.layers[0].mixer
    out = base_config(arch, model_type, architecture)
    out.update(num_attention_heads=op.num_heads, num_key_value_heads=op.num_kv_heads or op.num_heads,
               head_dim=op.head_dim, attention_bias=False, intermediate_size=arch.layers[0].ffn.hidden_size,
               rope_parameters={"rope_type": "default", "rope_theta": op.rope_theta})
    return out


def config(arch: ArchSpec) -> dict:
    return dense_config(arch, MODEL_TYPE, ARCHITECTURE) | {"mlp_bias": False}


DENSE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "rms_norm_eps", "tie_word_embeddings",
                "hidden_act", "num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias",
                "intermediate_size")


def architecture(cfg: dict) -> dict:
    rope = cfg.get("rope_parameters") or {}
    return ({k: cfg.get(k) for k in (*DENSE_FIELDS, "mlp_bias")}
            | {"rope": (rope.get("rope_type"), rope.get("rope_theta"), rope.get("partial_rotary_factor", 1.0))})


def dense_spec(cfg: dict, name: str, model_type: str, qk_norm: bool) -> ArchSpec:
    hidden_act(cfg)
    if any(t != "full_attention" for t in layer_types(cfg)):
        raise Blocker("layer_types", f"{model_type} layers other than full_attention (sliding windows)")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if cfg.get(key):
            raise Blocker(key, "true; loopnas has no attention output bias, MLP bias or sliding layers here")
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = rope_from(cfg, hd)
    if rope["rope_dim"] is not None:
        raise Blocker("rope_parameters.partial_rotary_factor", f"{model_type} rotates the whole head")
    attn = AttnSpec(num_heads=heads, num_kv_heads=None if kv == heads else kv, head_dim=hd,
                    qk_norm=NormSpec(eps=cfg.get("rms_norm_eps", 1e-6)) if qk_norm else False,
                    rope_theta=rope["rope_theta"])
    layer = LayerSpec(mixer=attn, ffn=SwiGLUSpec(hidden_size=cfg["intermediate_size"]))
    return ArchSpec(name=name, description=f"Imported from a {model_type} config.",
                    model=ModelSpec(**model_from(cfg)), layers=(layer,) * cfg["num_hidden_layers"])


def to_spec(cfg: dict, name: str) -> ArchSpec:
    return dense_spec(cfg, name, MODEL_TYPE, qk_norm=False)


def dense_convert(arch: ArchSpec, state: dict, qk_norm: bool) -> dict:
    out = shell(arch, state)
    names = ("q_proj", "k_proj", "v_proj", "o_proj") + (("q_norm", "k_norm") if qk_norm else ())
    for i in range(len(arch.layers)):
        out |= norms(state, i, "input_layernorm", "post_attention_layernorm")
        out |= rename(state, ((f"layers.{i}.mixer.{n}.weight", f"model.layers.{i}.self_attn.{n}.weight")
                              for n in names))
        out |= swiglu(state, f"layers.{i}.ffn", f"model.layers.{i}.mlp")
    return out


def convert(arch: ArchSpec, state: dict) -> dict:
    return dense_convert(arch, state, qk_norm=False)


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "config", "convert", "to_spec", "architecture"]
