"""What every native family shares: the blocker a spec meets first, the checks that find it,
and the weight moves common to all of them (embeddings, norms, SwiGLU, the LM head).

A family module (``qwen3_next``, ``olmo_hybrid``, ``nemotron_h``, ``falcon_h1``, ``llama``, ``qwen3``) defines ``MODEL_TYPE``,
``ARCHITECTURE``, ``blocker(arch)`` (the first field that keeps ``arch`` from being that
family exactly, or None), ``config(arch)`` (the transformers config as a dict),
``convert(arch, state)`` (loopnas state dict -> the family's), ``to_spec(config, name)``
(the import direction), ``architecture(config)`` (the config fields that define its architecture)
and optionally ``caveat(arch)`` (what an exact export still cannot do, which keeps ``auto`` on remote code).
A family loopnas cannot express at all (``kimi_linear``, ``inkling2_loop``) defines only ``MODEL_TYPE``,
``ARCHITECTURE``, ``blocker`` and ``to_spec``, which always refuse, naming the first field.
Nothing here imports torch at module level: ``loopnas import`` and the fit check need none.
"""
from __future__ import annotations

from typing import Any, Iterable

from nas.spec import ArchSpec, AttnSpec, GDNSpec, Mamba2Spec, NormSpec, SwitchSpec


class Blocker(Exception):
    """``path``: the first canonical-spec field (or config key) that prevents the mapping;
    raised by the import direction, returned by the export checks."""

    def __init__(self, path: str, reason: str):
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def first(checks: Iterable[Blocker | None]) -> Blocker | None:
    return next((b for b in checks if b is not None), None)


def structural(arch: ArchSpec, family: str) -> Blocker | None:
    """A native family runs every layer once, one fixed mixer per layer."""
    if arch.loops:
        r = arch.loops[0]
        return Blocker("loops[0]", f"a loop region ({r.start} .. {r.end}, T = {r.T}); {family} runs "
                                   "each layer once (export with --format remote)")
    for i, layer in enumerate(arch.layers):
        if isinstance(layer.mixer, SwitchSpec):
            return Blocker(f"layers[{i}].mixer", f"a random-placement switch; {family} has one mixer per layer")
    return None


def kinds_only(arch: ArchSpec, family: str, mixers: tuple[type, ...], ffns: tuple[type, ...]) -> Blocker | None:
    for i, layer in enumerate(arch.layers):
        if not isinstance(layer.mixer, mixers):
            names = " or ".join(t.model_fields["kind"].default for t in mixers)
            return Blocker(f"layers[{i}].mixer.kind", f"{layer.mixer.kind}; {family} has {names} mixers only")
        if not isinstance(layer.ffn, ffns):
            names = " or ".join(t.model_fields["kind"].default for t in ffns)
            return Blocker(f"layers[{i}].ffn.kind", f"{layer.ffn.kind}; {family} has {names} FFNs only")
    return None


def same(arch: ArchSpec, family: str, which: str, kind: type) -> Blocker | None:
    """Every op of ``kind`` in ``which`` (mixer/ffn) equal to the first: a family config holds
    one set of sizes per op kind."""
    ops = [(i, getattr(l, which)) for i, l in enumerate(arch.layers) if isinstance(getattr(l, which), kind)]
    for i, op in ops[1:]:
        if op != ops[0][1]:
            field = next(f for f in type(op).model_fields if getattr(op, f) != getattr(ops[0][1], f))
            return Blocker(f"layers[{i}].{which}.{field}",
                           f"{getattr(op, field)!r} differs from layers[{ops[0][0]}].{which}.{field} "
                           f"({getattr(ops[0][1], field)!r}); {family} has one {op.kind} configuration")
    return None


def one_of(kind: type, arch: ArchSpec, which: str = "mixer"):
    """``(index, op)`` of the first layer whose ``which`` op is a ``kind``, or None."""
    return next(((i, getattr(l, which)) for i, l in enumerate(arch.layers)
                 if isinstance(getattr(l, which), kind)), None)


def check(path: str, ok: bool, reason: str) -> Blocker | None:
    return None if ok else Blocker(path, reason)


def model_norm(arch: ArchSpec, family: str, zero_centered: bool) -> Blocker | None:
    norm = arch.model.norm
    if norm.kind != "rmsnorm":
        return Blocker("model.norm.kind", f"{norm.kind}; {family} uses RMSNorm")
    what = "zero-centred (1 + w)" if zero_centered else "plain (w, not 1 + w)"
    return check("model.norm.zero_centered", norm.zero_centered == zero_centered,
                 f"{norm.zero_centered}; {family}'s RMSNorm is {what}")


def placements(arch: ArchSpec, family: str, want) -> Blocker | None:
    """``want(layer) -> "pre" | "post"``: the family's norm placement for each layer."""
    for i, layer in enumerate(arch.layers):
        if layer.norm_placement != want(layer):
            return Blocker(f"layers[{i}].norm_placement",
                           f"{layer.norm_placement}; {family} puts this layer's norms {want(layer)}")
    return None


def qk_norm_is(op: AttnSpec, path: str, family: str, norm: NormSpec | None, over: str = "head") -> Blocker | None:
    """The attention's q/k norm must be ``norm`` (None: no q/k norm) applied ``over``."""
    have = NormSpec(eps=1e-5) if op.qk_norm is True else op.qk_norm or None
    if norm is None:
        return check(f"{path}.qk_norm", have is None, f"{family}'s attention has no q/k norm")
    if have != norm:
        return Blocker(f"{path}.qk_norm", f"{op.qk_norm!r}; {family} normalises q and k with "
                                          f"{norm!r} (the model's RMSNorm)")
    return check(f"{path}.qk_norm_over", op.qk_norm_over == over,
                 f"{op.qk_norm_over}; {family}'s q/k norm is over {'each head' if over == 'head' else 'all heads'}")


def attn_common(op: AttnSpec, path: str, family: str) -> Blocker | None:
    """What no family's attention has: a window, and biases (their attention_bias also biases o_proj)."""
    return first([
        check(f"{path}.window", op.window is None, f"sliding window {op.window}; {family} attention is full"),
        check(f"{path}.qkv_bias", not op.qkv_bias,
              f"{family}'s attention_bias also biases o_proj, which loopnas has not"),
    ])


def gdn_common(op: GDNSpec, path: str, family: str) -> Blocker | None:
    return first([
        check(f"{path}.use_gate", op.use_gate, f"{family}'s Gated DeltaNet always gates its output"),
        check(f"{path}.use_short_conv", op.use_short_conv, f"{family}'s Gated DeltaNet always has short convs"),
        check(f"{path}.conv_bias", not op.conv_bias, f"{family}'s short convs have no bias"),
    ])


def gdn_sizes(op: GDNSpec) -> dict[str, int]:
    return {"linear_num_key_heads": op.num_heads, "linear_num_value_heads": op.num_v_heads or op.num_heads,
            "linear_key_head_dim": op.head_dim, "linear_value_head_dim": int(op.head_dim * op.expand_v),
            "linear_conv_kernel_dim": op.conv_size}


def gdn_from(cfg: dict, **extra) -> GDNSpec:
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    return GDNSpec(num_heads=hk, num_v_heads=None if hv == hk else hv, head_dim=dk, expand_v=dv / dk,
                   conv_size=cfg.get("linear_conv_kernel_dim", 4), use_gate=True, use_short_conv=True, **extra)


def mamba2_common(op: Mamba2Spec, path: str, family: str, width: int) -> Blocker | None:
    """What transformers' Mamba2 mixers share: head h reads B/C group h // (H / G) (loopnas's
    h % G, as fla's torch path; the two agree for one group or one per head), D per head."""
    heads = op.expand * width // op.head_dim
    return first([
        check(f"{path}.n_groups", op.n_groups in (1, heads),
              f"{op.n_groups}; {family}'s heads read B/C groups in blocks (h // (H/G)), loopnas's in turn "
              f"(h % G): they agree for n_groups 1 or {heads} (one per head)"),
        check(f"{path}.D_has_hdim", not op.D_has_hdim, f"{family}'s D is one per head"),
    ])


def mamba2_sizes(op: Mamba2Spec, width: int) -> dict[str, int]:
    """Heads, head size, state size, groups, kernel of a Mamba2 op (transformers' numbers)."""
    return {"heads": op.expand * width // op.head_dim, "head_dim": op.head_dim, "state": op.state_size,
            "groups": op.n_groups, "kernel": op.conv_kernel}


def mamba2_from(width: int, heads: int, head_dim: int, keys: tuple[str, str], **fields) -> Mamba2Spec:
    """The Mamba2Spec of a config whose mixer has ``heads`` x ``head_dim`` channels; ``keys``
    name the config's heads and groups fields, the ones a refusal names."""
    if (heads * head_dim) % width:
        raise Blocker(keys[0], f"{heads} heads x {head_dim} = {heads * head_dim} channels, not a whole multiple "
                               f"of hidden_size {width}; loopnas's Mamba2 has expand x width channels")
    groups = fields.get("n_groups", 1)
    if groups not in (1, heads):
        raise Blocker(keys[1], f"{groups}; loopnas's Mamba2 heads read B/C groups in turn (h % G): "
                               f"exact for 1 group or one per head ({heads})")
    return Mamba2Spec(head_dim=head_dim, expand=heads * head_dim // width, **fields)


def rope_parameters(op: AttnSpec | None, partial: bool = False) -> dict | None:
    if op is None:
        return None
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": op.rope_theta}
    if partial:
        out["partial_rotary_factor"] = (op.rope_dim or op.head_dim) / op.head_dim
    return out


def rope_from(cfg: dict, head_dim: int, partial_default: float = 1.0) -> dict:
    """AttnSpec fields of a config's rotary embedding (default rope only)."""
    rope = dict(cfg.get("rope_parameters") or {})
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise Blocker("rope_parameters.rope_type", f"{kind}; loopnas has plain rotary embeddings only")
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", partial_default))
    rope_dim = int(head_dim * factor)
    return {"rope_theta": rope.get("rope_theta", 10000.0),
            "rope_dim": None if rope_dim == head_dim else rope_dim}


def base_config(arch: ArchSpec, model_type: str, architecture: str) -> dict[str, Any]:
    m = arch.model
    return {"model_type": model_type, "architectures": [architecture], "vocab_size": m.vocab_size,
            "hidden_size": m.width, "num_hidden_layers": len(arch.layers), "rms_norm_eps": m.norm.eps,
            "tie_word_embeddings": m.tie_embeddings, "hidden_act": "silu", "initializer_range": m.init_std,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def model_from(cfg: dict, zero_centered: bool = False) -> dict[str, Any]:
    """ModelSpec fields of a config (``tie_word_embeddings`` defaults to the family's)."""
    return {"vocab_size": cfg["vocab_size"], "width": cfg["hidden_size"],
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            "norm": NormSpec(eps=cfg.get("rms_norm_eps", 1e-6), zero_centered=zero_centered),
            "init_std": cfg.get("initializer_range", 0.02)}


def hidden_act(cfg: dict) -> None:
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise Blocker("hidden_act", f"{act}; loopnas FFNs are SwiGLU (silu)")


def layer_types(cfg: dict) -> list[str]:
    types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    bad = next((t for t in types if t not in ("full_attention", "linear_attention")), None)
    if bad is not None:
        raise Blocker("layer_types", f"{bad!r}; loopnas maps full_attention and linear_attention layers")
    return list(types)


def rename(state: dict, pairs: Iterable[tuple[str, str]]) -> dict:
    """``{new: state[old]}`` for every (old, new) pair."""
    return {new: state[old] for old, new in pairs}


def shell(arch: ArchSpec, state: dict) -> dict:
    """Embeddings, final norm and (untied) LM head, under transformers' names."""
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["norm.weight"]}
    if not arch.model.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out


def swiglu(state: dict, src: str, dst: str) -> dict:
    return rename(state, ((f"{src}.{p}.weight", f"{dst}.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")))


def norms(state: dict, i: int, mixer_norm: str, ffn_norm: str) -> dict:
    return rename(state, ((f"layers.{i}.mixer_norm.weight", f"model.layers.{i}.{mixer_norm}.weight"),
                          (f"layers.{i}.ffn_norm.weight", f"model.layers.{i}.{ffn_norm}.weight")))


def gdn_conv(state: dict, src: str):
    """fla's three short convs as one conv over the concatenated q, k, v channels."""
    import torch
    return torch.cat([state[f"{src}.{n}_conv1d.weight"] for n in "qkv"], dim=0)


__all__ = ["Blocker", "first", "structural", "kinds_only", "same", "one_of", "check", "model_norm",
           "placements", "qk_norm_is", "attn_common", "gdn_common", "gdn_sizes", "gdn_from", "mamba2_common",
           "mamba2_sizes", "mamba2_from",
           "rope_parameters", "rope_from", "base_config", "model_from", "hidden_act", "layer_types",
           "rename", "shell", "swiglu", "norms", "gdn_conv"]
