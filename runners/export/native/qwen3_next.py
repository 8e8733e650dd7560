"""transformers' ``qwen3_next``: Gated DeltaNet and gated softmax attention layers
(``layer_types``), zero-centred RMSNorm everywhere, pre-norm, per-head zero-centred q/k norm,
partial rotary, dense SwiGLU or MoE FFNs with a sigmoid-gated shared expert.

Weight layout (``transformers.models.qwen3_next.modeling_qwen3_next``): the GDN's q, k, v and
output gate z are one ``in_proj_qkvz`` grouped by key head (for key head h: q_h, k_h, then
the v and z rows of the value heads it serves), its b and a one ``in_proj_ba`` grouped the
same way; the attention's ``q_proj`` holds each head's query and output gate side by side;
the routed experts are stacked ``gate_up_proj`` (E, 2I, d) and ``down_proj`` (E, d, I).
"""
from __future__ import annotations

from nas.spec import ArchSpec, AttnSpec, GDNSpec, LayerSpec, ModelSpec, MoESpec, NormSpec, SwiGLUSpec

from .common import (
    Blocker, attn_common, base_config, check, first, gdn_common, gdn_conv, gdn_from, gdn_sizes, hidden_act,
    kinds_only, layer_types, model_from, model_norm, norms, one_of, placements, qk_norm_is, rename,
    rope_from, rope_parameters, same, shell, structural, swiglu,
)

MODEL_TYPE = "qwen3_next"
ARCHITECTURE = "Qwen3NextForCausalLM"
F = MODEL_TYPE


def _qk_norm(arch: ArchSpec) -> NormSpec:
    return NormSpec(eps=arch.model.norm.eps, zero_centered=True)


def _gdn(arch: ArchSpec) -> Blocker | None:
    if (found := one_of(GDNSpec, arch)) is None:
        return None
    i, op = found
    path = f"layers[{i}].mixer"
    return first([gdn_common(op, path, F),
                  check(f"{path}.allow_neg_eigval", not op.allow_neg_eigval,
                        f"{F}'s beta is sigmoid(b) in (0, 1) (olmo_hybrid has allow_neg_eigval)"),
                  check(f"{path}.norm_eps", op.norm_eps == arch.model.norm.eps,
                        f"{op.norm_eps:g}; {F}'s GDN output norm uses rms_norm_eps = model.norm.eps "
                        f"({arch.model.norm.eps:g})")])


def _attn(arch: ArchSpec) -> Blocker | None:
    if (found := one_of(AttnSpec, arch)) is None:
        return None
    i, op = found
    path, r = f"layers[{i}].mixer", op.rope_dim or op.head_dim
    return first([attn_common(op, path, F),
                  check(f"{path}.output_gate", op.output_gate, f"{F}'s attention always has the sigmoid output gate"),
                  qk_norm_is(op, path, F, _qk_norm(arch)),
                  check(f"{path}.rope_theta", op.rope_theta is not None, f"{F} always applies rotary embeddings"),
                  check(f"{path}.rope_dim", int(op.head_dim * (r / op.head_dim)) == r,
                        f"{r} of head_dim {op.head_dim} is not a partial_rotary_factor transformers rounds back")])


def _moe(arch: ArchSpec) -> Blocker | None:
    if (found := one_of(MoESpec, arch, "ffn")) is None:
        return None
    i, op = found
    return check(f"layers[{i}].ffn.shared_expert_gate", op.shared_expert_hidden > 0 and op.shared_expert_gate,
                 f"{F}'s MoE always has a shared expert with a sigmoid gate (set shared_expert_hidden and "
                 "shared_expert_gate)")


def blocker(arch: ArchSpec) -> Blocker | None:
    return first([
        structural(arch, F),
        kinds_only(arch, F, (GDNSpec, AttnSpec), (SwiGLUSpec, MoESpec)),
        model_norm(arch, F, zero_centered=True),
        placements(arch, F, lambda layer: "pre"),
        *(same(arch, F, which, kind) for which, kind in
          (("mixer", GDNSpec), ("mixer", AttnSpec), ("ffn", SwiGLUSpec), ("ffn", MoESpec))),
        _gdn(arch), _attn(arch), _moe(arch),
    ])


def caveat(arch: ArchSpec) -> str | None:
    """What an exact export of ``arch`` still cannot do in transformers: a model without an
    attention layer loads and gives loopnas's logits, but ``generate()`` fails
    (Qwen3Next's hybrid cache asks an attention layer for the sequence length)."""
    if one_of(AttnSpec, arch) is None:
        return ("transformers' Qwen3Next cannot generate() without an attention layer "
                "(its cache takes the sequence length from one)")
    return None


def config(arch: ArchSpec) -> dict:
    out = base_config(arch, MODEL_TYPE, ARCHITECTURE)
    out["layer_types"] = ["linear_attention" if isinstance(l.mixer, GDNSpec) else "full_attention"
                          for l in arch.layers]
    if (found := one_of(AttnSpec, arch)) is not None:
        op = found[1]
        out.update(num_attention_heads=op.num_heads, num_key_value_heads=op.num_kv_heads or op.num_heads,
                   head_dim=op.head_dim, attention_bias=False, rope_parameters=rope_parameters(op, partial=True))
    if (found := one_of(GDNSpec, arch)) is not None:
        out.update(gdn_sizes(found[1]))
    dense = [i for i, l in enumerate(arch.layers) if isinstance(l.ffn, SwiGLUSpec)]
    if dense:
        out["intermediate_size"] = arch.layers[dense[0]].ffn.hidden_size
    if (found := one_of(MoESpec, arch, "ffn")) is not None:
        op = found[1]
        out.update(num_experts=op.num_experts, num_experts_per_tok=op.top_k, moe_intermediate_size=op.expert_hidden,
                   shared_expert_intermediate_size=op.shared_expert_hidden, norm_topk_prob=True,
                   decoder_sparse_step=1, mlp_only_layers=dense, router_aux_loss_coef=op.aux_loss_coef)
    else:
        out.update(num_experts=0, mlp_only_layers=[])
    return out


def _moe_layers(cfg: dict) -> list[bool]:
    step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or ())
    return [cfg.get("num_experts", 0) > 0 and i not in dense and (i + 1) % step == 0
            for i in range(cfg["num_hidden_layers"])]


def architecture(cfg: dict) -> dict:
    """The config fields that decide the model, with dead ones (attention sizes of a model
    without attention, ...) left out and the MoE layout per layer."""
    types, moe = cfg["layer_types"], _moe_layers(cfg)
    out = {k: cfg.get(k) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "rms_norm_eps",
                                   "tie_word_embeddings", "hidden_act")}
    out["layer_types"], out["moe_layers"] = list(types), moe
    if "full_attention" in types:
        rope = cfg.get("rope_parameters") or {}
        out.update({k: cfg.get(k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias")},
                   rope=(rope.get("rope_type"), rope.get("rope_theta"), rope.get("partial_rotary_factor")))
    if "linear_attention" in types:
        out.update({k: cfg.get(k) for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                            "linear_value_head_dim", "linear_conv_kernel_dim")})
    if not all(moe):
        out["intermediate_size"] = cfg.get("intermediate_size")
    if any(moe):
        out.update({k: cfg.get(k) for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                            "shared_expert_intermediate_size", "norm_topk_prob")})
    return out


def to_spec(cfg: dict, name: str) -> ArchSpec:
    hidden_act(cfg)
    types, moe, eps = layer_types(cfg), _moe_layers(cfg), cfg.get("rms_norm_eps", 1e-6)
    if cfg.get("attention_bias"):
        raise Blocker("attention_bias", "true; loopnas attention has no o_proj bias")
    if any(moe) and not cfg.get("norm_topk_prob", True):
        raise Blocker("norm_topk_prob", "false; loopnas renormalises the top-k routing weights")
    if any(moe) and not cfg.get("shared_expert_intermediate_size"):
        raise Blocker("shared_expert_intermediate_size", "0; loopnas has a shared-expert gate only with a shared expert")
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    attn = AttnSpec(num_heads=heads, num_kv_heads=None if kv == heads else kv, head_dim=hd, output_gate=True,
                    qk_norm=NormSpec(eps=eps, zero_centered=True), **rope_from(cfg, hd, partial_default=0.25))
    gdn = gdn_from(cfg, norm_eps=eps) if "linear_attention" in types else None
    dense = SwiGLUSpec(hidden_size=cfg["intermediate_size"])
    routed = MoESpec(num_experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                     expert_hidden=cfg["moe_intermediate_size"],
                     shared_expert_hidden=cfg.get("shared_expert_intermediate_size", 0), shared_expert_gate=True,
                     aux_loss_coef=cfg.get("router_aux_loss_coef", 0.001)) if any(moe) else None
    layers = tuple(LayerSpec(mixer=gdn if t == "linear_attention" else attn, ffn=routed if m else dense)
                   for t, m in zip(types, moe))
    return ArchSpec(name=name, description=f"Imported from a {MODEL_TYPE} config.",
                    model=ModelSpec(**model_from(cfg, zero_centered=True)), layers=layers)


def _gdn_weights(arch: ArchSpec, state: dict, src: str, dst: str, op: GDNSpec) -> dict:
    hk, hv = op.num_heads, op.num_v_heads or op.num_heads
    dk, dv, r = op.head_dim, int(op.head_dim * op.expand_v), (op.num_v_heads or op.num_heads) // op.num_heads
    import torch

    def grouped(name: str, rows: int):
        return state[f"{src}.{name}.weight"].reshape(hk, rows, -1)  # (key heads, rows per head, d)

    qkvz = torch.cat([grouped("q_proj", dk), grouped("k_proj", dk), grouped("v_proj", r * dv),
                      grouped("g_proj", r * dv)], dim=1).reshape(-1, arch.model.width)
    ba = torch.cat([grouped("b_proj", r), grouped("a_proj", r)], dim=1).reshape(2 * hv, -1)
    return {f"{dst}.in_proj_qkvz.weight": qkvz, f"{dst}.in_proj_ba.weight": ba,
            f"{dst}.conv1d.weight": gdn_conv(state, src),
            **rename(state, ((f"{src}.A_log", f"{dst}.A_log"), (f"{src}.dt_bias", f"{dst}.dt_bias"),
                             (f"{src}.o_norm.weight", f"{dst}.norm.weight"),
                             (f"{src}.o_proj.weight", f"{dst}.out_proj.weight")))}


def _attn_weights(state: dict, src: str, dst: str, op: AttnSpec) -> dict:
    import torch
    q = state[f"{src}.q_proj.weight"].reshape(op.num_heads, op.head_dim, -1)
    g = state[f"{src}.g_proj.weight"].reshape(op.num_heads, op.head_dim, -1)
    out = {f"{dst}.q_proj.weight": torch.cat([q, g], dim=1).reshape(2 * op.num_heads * op.head_dim, -1)}
    return out | rename(state, ((f"{src}.{p}.weight", f"{dst}.{p}.weight")
                                for p in ("k_proj", "v_proj", "o_proj", "q_norm", "k_norm")))


def _moe_weights(state: dict, src: str, dst: str, op: MoESpec) -> dict:
    import torch
    experts = range(op.num_experts)
    gate_up = torch.stack([torch.cat([state[f"{src}.experts.{e}.gate_proj.weight"],
                                      state[f"{src}.experts.{e}.up_proj.weight"]]) for e in experts])
    down = torch.stack([state[f"{src}.experts.{e}.down_proj.weight"] for e in experts])
    return {f"{dst}.gate.weight": state[f"{src}.gate.weight"], f"{dst}.experts.gate_up_proj": gate_up,
            f"{dst}.experts.down_proj": down, **swiglu(state, f"{src}.shared_expert", f"{dst}.shared_expert"),
            f"{dst}.shared_expert_gate.weight": state[f"{src}.shared_expert_gate.weight"]}


def convert(arch: ArchSpec, state: dict) -> dict:
    out = shell(arch, state)
    for i, layer in enumerate(arch.layers):
        src, dst = f"layers.{i}", f"model.layers.{i}"
        out |= norms(state, i, "input_layernorm", "post_attention_layernorm")
        if isinstance(layer.mixer, GDNSpec):
            out |= _gdn_weights(arch, state, f"{src}.mixer", f"{dst}.linear_attn", layer.mixer)
        else:
            out |= _attn_weights(state, f"{src}.mixer", f"{dst}.self_attn", layer.mixer)
        if isinstance(layer.ffn, MoESpec):
            out |= _moe_weights(state, f"{src}.ffn", f"{dst}.mlp", layer.ffn)
        else:
            out |= swiglu(state, f"{src}.ffn", f"{dst}.mlp")
    return out


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "caveat", "config", "convert", "to_spec", "architecture"]
