"""transformers' ``falcon_h1``: every layer runs a Mamba2 and an attention side by side on the
same pre-normed input and adds their outputs, ``h + ssm(norm(h)) + attn(norm(h))``, then a
pre-norm SwiGLU; plain RMSNorm, full rotary, no q/k norm.

loopnas's :class:`~nas.spec.ParallelSpec` with one ``mamba2`` and one ``attn`` branch is that
layer: ``combine: sum`` exactly, ``combine: mean`` with both output multipliers at 0.5. Falcon's
other µP multipliers stay 1. The Mamba2's gated norm is optional (``mamba_rms_norm``) and may
norm before or after the gate (``mamba_norm_before_gate``), as loopnas's.

Weights (``transformers.models.falcon_h1.modeling_falcon_h1``): the Mamba2 under
``model.layers.{i}.mamba`` and the attention under ``self_attn`` with loopnas's names, the
SwiGLU as ``feed_forward``, the norms ``input_layernorm`` and ``pre_ff_layernorm``, the final
norm ``model.final_layernorm``.
"""
from __future__ import annotations

from nas.spec import ArchSpec, AttnSpec, LayerSpec, Mamba2Spec, ModelSpec, ParallelSpec, SwiGLUSpec

from .common import (
    Blocker, attn_common, base_config, check, first, hidden_act, kinds_only, mamba2_common, mamba2_from,
    mamba2_sizes, model_from, model_norm, norms, placements, qk_norm_is, rope_from, same, shell,
    structural, swiglu,
)

MODEL_TYPE = "falcon_h1"
ARCHITECTURE = "FalconH1ForCausalLM"
F = MODEL_TYPE
OUT_MULTIPLIER = {"sum": 1.0, "mean": 0.5}  # what each branch's output is scaled by before the add
UNIT = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
        "ssm_in_multiplier")


def branch(op: ParallelSpec, kind: type) -> tuple[int, Mamba2Spec | AttnSpec]:
    return next((j, b) for j, b in enumerate(op.branches) if isinstance(b, kind))


def _layer(arch: ArchSpec) -> Blocker | None:
    """The parallel layer itself: one Mamba2 and one attention, added or averaged, nothing between."""
    op, path = arch.layers[0].mixer, "layers[0].mixer"
    kinds = sorted(b.kind for b in op.branches)
    return first([
        check(f"{path}.branches", kinds == ["attn", "mamba2"],
              f"{', '.join(kinds)}; {F}'s layer is one mamba2 and one attn branch"),
        check(f"{path}.combine", op.combine in OUT_MULTIPLIER, f"{op.combine}; {F} adds its branches (sum or mean)"),
        check(f"{path}.branch_norm", not op.branch_norm, f"{F} normalises no branch output"),
        check(f"{path}.branch_scale", not op.branch_scale, f"{F} scales its branches by fixed multipliers only"),
    ])


def _ops(arch: ArchSpec) -> Blocker | None:
    op, width, eps = arch.layers[0].mixer, arch.model.width, arch.model.norm.eps
    (j, mamba), (k, attn) = branch(op, Mamba2Spec), branch(op, AttnSpec)
    m, a = f"layers[0].mixer.branches[{j}]", f"layers[0].mixer.branches[{k}]"
    return first([
        mamba2_common(mamba, m, F, width),
        check(f"{m}.norm_eps", not mamba.rmsnorm or mamba.norm_eps == eps,
              f"{mamba.norm_eps:g}; {F}'s Mamba2 norm uses rms_norm_eps = model.norm.eps ({eps:g})"),
        attn_common(attn, a, F),
        check(f"{a}.output_gate", not attn.output_gate, f"{F}'s attention has no output gate"),
        qk_norm_is(attn, a, F, None),
        check(f"{a}.head_dim", attn.head_dim * attn.num_heads == width,
              f"{attn.head_dim}; {F}'s head_dim is hidden_size / num_heads = {width // attn.num_heads}"),
        check(f"{a}.rope_theta", attn.rope_theta is not None, f"{F} always applies rotary embeddings"),
        check(f"{a}.rope_dim", attn.rope_dim in (None, attn.head_dim), f"{F}'s rotary is over the whole head"),
    ])


def blocker(arch: ArchSpec) -> Blocker | None:
    b = first([structural(arch, F), kinds_only(arch, F, (ParallelSpec,), (SwiGLUSpec,)),
               model_norm(arch, F, zero_centered=False), placements(arch, F, lambda layer: "pre"),
               same(arch, F, "mixer", ParallelSpec), same(arch, F, "ffn", SwiGLUSpec)])
    if b is not None or (b := _layer(arch)) is not None:
        return b
    return _ops(arch)


def config(arch: ArchSpec) -> dict:
    op = arch.layers[0].mixer
    mamba, attn = branch(op, Mamba2Spec)[1], branch(op, AttnSpec)[1]
    s, scale = mamba2_sizes(mamba, arch.model.width), OUT_MULTIPLIER[op.combine]
    out = base_config(arch, MODEL_TYPE, ARCHITECTURE)
    out.update(intermediate_size=arch.layers[0].ffn.hidden_size, mlp_bias=False, attention_bias=False,
               num_attention_heads=attn.num_heads, num_key_value_heads=attn.num_kv_heads or attn.num_heads,
               rope_parameters={"rope_type": "default", "rope_theta": attn.rope_theta},
               mamba_d_ssm=mamba.expand * arch.model.width, mamba_expand=mamba.expand, mamba_n_heads=s["heads"],
               mamba_d_head=s["head_dim"], mamba_d_state=s["state"], mamba_n_groups=s["groups"],
               mamba_d_conv=s["kernel"], mamba_conv_bias=mamba.use_conv_bias, mamba_proj_bias=mamba.use_bias,
               projectors_bias=mamba.use_bias, mamba_rms_norm=mamba.rmsnorm,
               mamba_norm_before_gate=mamba.norm_before_gate,
               ssm_out_multiplier=scale, attention_out_multiplier=scale)
    return out


KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "rms_norm_eps", "tie_word_embeddings",
        "hidden_act", "intermediate_size", "mlp_bias", "attention_bias", "num_attention_heads", "num_key_value_heads",
        "mamba_d_ssm", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv",
        "mamba_conv_bias", "mamba_proj_bias", "projectors_bias", "mamba_rms_norm", "mamba_norm_before_gate",
        "ssm_out_multiplier", "attention_out_multiplier", *UNIT)


def architecture(cfg: dict) -> dict:
    rope = cfg.get("rope_parameters") or {}
    return ({k: cfg.get(k) for k in KEYS} | {"rope": (rope.get("rope_type"), rope.get("rope_theta")),
            "mlp_multipliers": list(cfg.get("mlp_multipliers") or ()),
            "ssm_multipliers": list(cfg.get("ssm_multipliers") or ()),
            "time_step_limit": tuple(cfg.get("time_step_limit") or ())})


def _multipliers(cfg: dict) -> str:
    """The combine the config's multipliers are (sum or mean); any other multiplier refused."""
    for key in UNIT:
        if cfg.get(key, 1.0) != 1.0:
            raise Blocker(key, f"{cfg[key]}; loopnas has no µP multipliers (only 1)")
    for key in ("mlp_multipliers", "ssm_multipliers"):
        if any(x != 1.0 for x in cfg.get(key) or ()):
            raise Blocker(key, f"{cfg[key]}; loopnas has no µP multipliers (only 1)")
    outs = (cfg.get("ssm_out_multiplier", 1.0), cfg.get("attention_out_multiplier", 1.0))
    combine = next((c for c, s in OUT_MULTIPLIER.items() if outs == (s, s)), None)
    if combine is None:
        raise Blocker("ssm_out_multiplier", f"{outs[0]} and attention_out_multiplier {outs[1]}; loopnas adds "
                                            "its branches (both 1) or averages them (both 0.5)")
    return combine


def to_spec(cfg: dict, name: str) -> ArchSpec:
    hidden_act(cfg)
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise Blocker(key, "true; loopnas's attention and SwiGLU have no output bias")
    if cfg.get("mamba_proj_bias") != cfg.get("projectors_bias"):
        raise Blocker("projectors_bias", "differs from mamba_proj_bias; loopnas's Mamba2 biases both or neither")
    if tuple(cfg.get("time_step_limit") or (0.0, float("inf"))) != (0.0, float("inf")):
        raise Blocker("time_step_limit", f"{cfg['time_step_limit']}; loopnas's Mamba2 does not clamp its step")
    combine, width, eps = _multipliers(cfg), cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-5)
    d_ssm = cfg.get("mamba_d_ssm") or cfg.get("mamba_expand", 2) * width
    heads = cfg["mamba_n_heads"]
    mamba = mamba2_from(width, heads, d_ssm // heads, ("mamba_d_ssm", "mamba_n_groups"),
                        state_size=cfg["mamba_d_state"], n_groups=cfg.get("mamba_n_groups", 1),
                        conv_kernel=cfg.get("mamba_d_conv", 4), use_conv_bias=bool(cfg.get("mamba_conv_bias", True)),
                        use_bias=bool(cfg.get("mamba_proj_bias", False)), rmsnorm=bool(cfg.get("mamba_rms_norm")),
                        norm_before_gate=bool(cfg.get("mamba_norm_before_gate", True)), norm_eps=eps)
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    rope = rope_from(cfg, width // heads)
    attn = AttnSpec(num_heads=heads, num_kv_heads=None if kv == heads else kv, head_dim=width // heads,
                    rope_theta=rope["rope_theta"])
    layer = LayerSpec(mixer=ParallelSpec(branches=(mamba, attn), combine=combine),
                      ffn=SwiGLUSpec(hidden_size=cfg["intermediate_size"]))
    return ArchSpec(name=name, description=f"Imported from a {MODEL_TYPE} config.",
                    model=ModelSpec(**model_from(cfg)), layers=(layer,) * cfg["num_hidden_layers"])


def convert(arch: ArchSpec, state: dict) -> dict:
    out = shell(arch, state)
    out["model.final_layernorm.weight"] = out.pop("model.norm.weight")
    op = arch.layers[0].mixer
    (j, _), (k, _) = branch(op, Mamba2Spec), branch(op, AttnSpec)
    for i in range(len(arch.layers)):
        dst = f"model.layers.{i}"
        out |= norms(state, i, "input_layernorm", "pre_ff_layernorm")
        for b, name in ((j, "mamba"), (k, "self_attn")):
            src = f"layers.{i}.mixer.branches.{b}."
            out |= {f"{dst}.{name}.{key.removeprefix(src)}": v for key, v in state.items() if key.startswith(src)}
        out |= swiglu(state, f"layers.{i}.ffn", f"{dst}.feed_forward")
    return out


__all__ = ["MODEL_TYPE", "ARCHITECTURE", "blocker", "config", "convert", "to_spec", "architecture"]
