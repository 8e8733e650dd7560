"""transformers' ``nemotron_h``: a stack of single-mixer blocks, ``h + mixer(norm(h))``, each a
Mamba2 (``linear_attention``), an attention (``full_attention``), an MLP or an MoE block
(``layers_block_type``); plain RMSNorm, untied LM head (``tie_word_embeddings`` ties nothing).

loopnas expresses the Mamba2 and attention blocks: a layer with ``ffn: none`` is one block.
Its MLP blocks (``up``, relu², ``down``, no gate) and MoE blocks (non-gated relu² experts,
sigmoid routing) have no loopnas FFN, so a spec with an FFN is refused at that field. The
attention has no rotary embedding, no q/k norm and no output gate; the Mamba2 is gated-norm
(``x · silu(z)`` then a group RMSNorm with eps ``layer_norm_epsilon``), D per head.

Weights (``transformers.models.nemotron_h.modeling_nemotron_h``) keep loopnas's names under
``model.layers.{i}.mixer``; the block's norm is ``model.layers.{i}.norm``, the embeddings
``model.embeddings``, the final norm ``model.norm_f``.
"""
from __future__ import annotations

from nas.spec import MAX_LAYERS, ArchSpec, AttnSpec, LayerSpec, Mamba2Spec, ModelSpec, NoFFNSpec, NormSpec

from .common import (
    Blocker, attn_common, check, first, kinds_only, mamba2_common, mamba2_from, mamba2_sizes, model_norm, one_of,
    placements, qk_norm_is, rename, same, structural,
)

MODEL_TYPE = "nemotron_h"
ARCHITECTURE = "NemotronHForCausalLM"
F = MODEL_TYPE
BLOCKS = {Mamba2Spec: "linear_attention", AttnSpec: "full_attention"}


def _ffn(arch: ArchSpec) -> Blocker | None:
    for i, layer in enumerate(arch.layers):
        if not isinstance(layer.ffn, NoFFNSpec):
            return Blocker(f"layers[{i}].ffn.kind", f"{layer.ffn.kind}; {F}'s MLP and MoE blocks are non-gated "
                                                    "(up, relu², down), which loopnas has not: use ffn: none")
    return None


def _mamba(arch: ArchSpec) -> Blocker | None:
    if (found := one_of(Mamba2Spec, arch)) is None:
        return None
    i, op = found
    path, eps = f"layers[{i}].mixer", arch.model.norm.eps
    return first([mamba2_common(op, path, F, arch.model.width),
                  check(f"{path}.rmsnorm", op.rmsnorm, f"{F}'s Mamba2 always has its gated RMSNorm"),
                  check(f"{path}.norm_before_gate", not op.norm_before_gate,
                        f"{F}'s Mamba2 gates before its norm (rms(x · silu(z)))"),
                  check(f"{path}.norm_eps", op.norm_eps == eps,
                        f"{op.norm_eps:g}; {F}'s Mamba2 norm uses layer_norm_epsilon = model.norm.eps ({eps:g})")])


def _attn(arch: ArchSpec) -> Blocker | None:
    if (found := one_of(AttnSpec, arch)) is None:
        return None
    i, op = found
    path = f"layers[{i}].mixer"
    return first([attn_common(op, path, F),
                  check(f"{path}.output_gate", not op.output_gate, f"{F}'s attention has no output gate"),
                  qk_norm_is(op, path, F, None),
                  check(f"{path}.rope_theta", op.rope_theta is None,
                        f"{op.rope_theta!r}; {F}'s attention has no positional encoding (set rope_theta: null)")])


def blocker(arch: ArchSpec) -> Blocker | None:
    return first([
        structural(arch, F), _ffn(arch), kinds_only(arch, F, (Mamba2Spec, AttnSpec), (NoFFNSpec,)),
        model_norm(arch, F, zero_centered=False),
        check("model.tie_embeddings", not arch.model.tie_embeddings,
              f"true; {F}'s lm_head is never tied to the embeddings"),
        placements(arch, F, lambda layer: "pre"),
        same(arch, F, "mixer", Mamba2Spec), same(arch, F, "mixer", AttnSpec), _mamba(arch), _attn(arch),
    ])


def caveat(arch: ArchSpec) -> str | None:
    """transformers' hybrid cache takes the sequence length from an attention layer."""
    if one_of(AttnSpec, arch) is None:
        return ("transformers' NemotronH cannot generate() without an attention layer "
                "(its cache takes the sequence length from one)")
    return None


def config(arch: ArchSpec) -> dict:
    m = arch.model
    out = {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "vocab_size": m.vocab_size,
           "hidden_size": m.width, "layers_block_type": [BLOCKS[type(l.mixer)] for l in arch.layers],
           "layer_norm_epsilon": m.norm.eps, "tie_word_embeddings": False, "initializer_range": m.init_std,
           "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    if (found := one_of(AttnSpec, arch)) is not None:
        op = found[1]
        out.update(num_attention_heads=op.num_heads, num_key_value_heads=op.num_kv_heads or op.num_heads,
                   head_dim=op.head_dim, attention_bias=False)
    if (found := one_of(Mamba2Spec, arch)) is not None:
        op, s = found[1], mamba2_sizes(found[1], m.width)
        out.update(mamba_num_heads=s["heads"], mamba_head_dim=s["head_dim"], ssm_state_size=s["state"],
                   n_groups=s["groups"], conv_kernel=s["kernel"], expand=op.expand, use_conv_bias=op.use_conv_bias,
                   use_bias=op.use_bias, mamba_hidden_act="silu")
    return out


def architecture(cfg: dict) -> dict:
    types = list(cfg.get("layers_block_type") or cfg.get("layer_types") or ())
    out = {k: cfg.get(k) for k in ("model_type", "vocab_size", "hidden_size", "layer_norm_epsilon")}
    out["layers_block_type"] = types
    if "full_attention" in types:
        out.update({k: cfg.get(k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim")})
    if "linear_attention" in types:
        out.update({k: cfg.get(k) for k in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                                            "conv_kernel", "use_conv_bias", "use_bias", "mamba_hidden_act")},
                   time_step_limit=tuple(cfg.get("time_step_limit") or ()))
    return out


def to_spec(cfg: dict, name: str) -> ArchSpec:
    types = list(cfg.get("layers_block_type") or cfg.get("layer_types") or ())
    if len(types) > MAX_LAYERS:
        raise Blocker("layers_block_type", f"{len(types)} blocks; loopnas takes at most {MAX_LAYERS} layers")
    bad = next((t for t in types if t not in ("linear_attention", "full_attention")), None)
    if bad is not None:
        raise Blocker("layers_block_type", f"{bad!r}; {F}'s MLP and MoE blocks are non-gated (up, relu², down), "
                                           "which loopnas has not (it maps linear_attention and full_attention)")
    if cfg.get("mamba_hidden_act", "silu") not in ("silu", "swish"):
        raise Blocker("mamba_hidden_act", f"{cfg['mamba_hidden_act']}; loopnas's Mamba2 uses silu")
    if tuple(cfg.get("time_step_limit") or (0.0, float("inf"))) != (0.0, float("inf")):
        raise Blocker("time_step_limit", f"{cfg['time_step_limit']}; loopnas's Mamba2 does not clamp its step")
    eps, width = cfg.get("layer_norm_epsilon", 1e-5), cfg["hidden_size"]
    mixers = {}
    if "linear_attention" in types:
        mixers["linear_attention"] = mamba2_from(
            width, cfg["mamba_num_heads"], cfg["mamba_head_dim"], ("mamba_num_heads", "n_groups"),
            state_size=cfg["ssm_state_size"], n_groups=cfg.get("n_groups", 1), conv_kernel=cfg.get("conv_kernel", 4),
            use_conv_bias=bool(cfg.get("use_conv_bias", True)), use_bias=bool(cfg.get("use_bias", False)),
            norm_eps=eps)
    if "full_attention" in types:
        heads = cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads") or heads
        mixers["full_attention"] = AttnSpec(num_heads=heads, num_kv_heads=None if kv == heads else kv,
                                            head_dim=cfg.get("head_dim") or width // heads, rope_theta=None)
    model = ModelSpec(vocab_size=cfg["vocab_size"], width=width, tie_embeddings=False, norm=NormSpec(eps=eps),
                      init_std=cfg.get("initializer_range", 0.02))
    return ArchSpec(name=name, description=f"Imported from a {MODEL_TYPE} config.", model=model,
                    layers=tuple(LayerSpec(mixer=mixers[t], ffn=NoFFNSpec()) for t in types))


def convert(arch: ArchSpec, state: dict) -> dict:
    out = {"model.embeddings.weight": state["embed.weight"], "model.norm_f.weight": state["norm.weight"],
           "lm_head.weight": state["lm_head.weight"]}
    for i in range(len(arch.layers)):
        src, dst = f"layers.{i}.mixer.", f"model.layers.{i}.mixer."
        out |= {dst + k.removeprefix(src): v for k, v in state.items() if k.startswith(src)}
        out |= rename(state, ((f"layers.{i}.mixer_norm.weight", f"model.layers.{i}.norm.weight"),))
    return out


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "caveat", "config", "convert", "to_spec", "architecture"]
