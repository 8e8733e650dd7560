"""Every op spec type mapped to its module builder.

A spec's fields carry fla's constructor names where fla has the layer, so each builder
is a small field → kwarg mapping. The ``fla`` backend returns fla's own layer (same
parameter names), the ``torch`` backend the pure-PyTorch twin.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from nas.spec import (
    AttnSpec, DeltaNetSpec, DSASpec, GDNSpec, KDASpec, Mamba2Spec, MoESpec, NormSpec, NSASpec,
    ParallelSpec, SwiGLUSpec, SwitchSpec,
)

from .layers import attention as attn_layers
from .layers import ffn as ffn_layers
from .layers import linear_mixers
from .layers.norms import ZeroCenteredRMSNorm
from .registry import BuildCtx, build_op, call_op, register


def _fields(spec, *drop: str) -> dict:
    return spec.model_dump(exclude={"kind", *drop})


def _linear(kind: str, kwargs: dict, ctx: BuildCtx) -> nn.Module:
    kwargs = {"hidden_size": ctx.width, **kwargs}
    if ctx.backend == "fla":
        return linear_mixers.make_fla(kind, **kwargs)
    return linear_mixers.TORCH_LAYERS[kind](**kwargs)


def _linear_builder(kind: str):
    def build(spec, ctx: BuildCtx) -> nn.Module:
        kwargs = _fields(spec)
        if kwargs.get("chunk_size", 0) is None and ctx.backend == "fla":
            del kwargs["chunk_size"]  # fla's layer keeps its own default
        return _linear(kind, kwargs, ctx)
    return build


for _spec_type, _kind in ((GDNSpec, "gdn"), (DeltaNetSpec, "deltanet"), (KDASpec, "kda"),
                          (Mamba2Spec, "mamba2")):
    register(_spec_type)(_linear_builder(_kind))


def _attn_kwargs(spec, ctx: BuildCtx) -> dict:
    return dict(hidden_size=ctx.width, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                qkv_bias=spec.qkv_bias, qk_norm=bool(spec.qk_norm), rope_theta=spec.rope_theta)


def _attn_options(spec: AttnSpec) -> dict:
    """Options of ours beyond fla's (only where set, so fla's layer serves the rest)."""
    kw = {}
    if isinstance(spec.qk_norm, NormSpec):
        kw["qk_norm_module"] = functools.partial(make_norm, spec.qk_norm)
    if spec.qk_norm_over != "head":
        kw["qk_norm_over"] = spec.qk_norm_over
    if spec.rope_dim is not None and spec.rope_dim != spec.head_dim:
        kw["rope_dim"] = spec.rope_dim
    return kw


@register(AttnSpec)
def _attn(spec: AttnSpec, ctx: BuildCtx) -> nn.Module:
    kw = {**_attn_kwargs(spec, ctx), "window_size": spec.window, "head_dim": spec.head_dim,
          "output_gate": spec.output_gate, **_attn_options(spec)}
    # make_fla falls back to the torch layer for options fla lacks (output gate, head_dim)
    if ctx.backend == "fla":
        return attn_layers.make_fla("attn", **kw)
    return attn_layers.Attention(**kw)


@register(DSASpec)
def _dsa(spec: DSASpec, ctx: BuildCtx) -> nn.Module:
    kw = {**_attn_kwargs(spec, ctx), "head_dim": spec.head_dim, "index_heads": spec.index_heads,
          "index_head_dim": spec.index_head_dim, "topk": spec.topk, "output_gate": spec.output_gate}
    return attn_layers.DeepSeekSparseAttention(**kw)


@register(NSASpec)
def _nsa(spec: NSASpec, ctx: BuildCtx) -> nn.Module:
    kw = dict(hidden_size=ctx.width, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
              head_dim=spec.head_dim, qkv_bias=spec.qkv_bias, block_size=spec.block_size,
              block_counts=spec.block_counts, window_size=spec.window, rope_theta=spec.rope_theta)
    if ctx.backend == "fla":
        return attn_layers.make_fla("nsa", **kw)
    return attn_layers.NativeSparseAttention(**kw)


@register(SwiGLUSpec)
def _swiglu(spec: SwiGLUSpec, ctx: BuildCtx) -> nn.Module:
    if ctx.backend == "fla":
        return ffn_layers.make_fla_swiglu(ctx.width, intermediate_size=spec.hidden_size)
    return ffn_layers.SwiGLU(ctx.width, intermediate_size=spec.hidden_size)


@register(MoESpec)
def _moe(spec: MoESpec, ctx: BuildCtx) -> nn.Module:
    return ffn_layers.MoE(ctx.width, num_experts=spec.num_experts, top_k=spec.top_k,
                          expert_hidden=spec.expert_hidden,
                          shared_expert_hidden=spec.shared_expert_hidden,
                          shared_expert_gate=spec.shared_expert_gate)


def make_norm(spec: NormSpec, width: int) -> nn.Module:
    """The norm modules of the model (pre-norms, final norm, iteration and branch norms)."""
    if spec.kind == "layernorm":
        return nn.LayerNorm(width, eps=spec.eps)
    if spec.zero_centered:
        return ZeroCenteredRMSNorm(width, eps=spec.eps)
    return nn.RMSNorm(width, eps=spec.eps)


class Parallel(nn.Module):
    """Branches on the same input, each output normalised by ``norms.{i}``
    (``branch_norm``) and scaled by ``scale[i]`` (``branch_scale``, per channel, initially
    1), then combined by mean, sum, or concat + linear ``proj``.

    Decoding (:mod:`builders.cache`): branch ``i`` reads ``cache["branches.{i}"]``;
    ``commit`` is one flag for all branches or one per branch (ELR's ``last_loop`` commits
    an attention branch only in the last iteration, a recurrent branch in every one).
    """

    def __init__(self, spec: ParallelSpec, ctx: BuildCtx):
        super().__init__()
        self.combine = spec.combine
        self.branches = nn.ModuleList(build_op(b, ctx) for b in spec.branches)
        self._takes_window = [isinstance(b, (AttnSpec, NSASpec)) for b in spec.branches]
        if spec.branch_norm:
            self.norms = nn.ModuleList(make_norm(spec.branch_norm, ctx.width) for _ in spec.branches)
        if spec.branch_scale:
            self.scale = nn.Parameter(torch.ones(len(spec.branches), ctx.width))
        if spec.combine == "concat":
            self.proj = nn.Linear(len(spec.branches) * ctx.width, ctx.width, bias=False)

    returns_aux = True  # builders.registry.call_op: the auxiliary losses of every branch

    def forward(self, x: torch.Tensor, cache: dict | None = None, commit: bool | tuple[bool, ...] = True,
                return_aux: bool = False, **overrides):  # (B, T, D)
        commits = commit if isinstance(commit, tuple) else (commit,) * len(self.branches)
        outs, aux = [], []
        for i, (b, takes, c) in enumerate(zip(self.branches, self._takes_window, commits)):
            kw = dict(overrides) if takes else {}
            if cache is not None:
                kw.update(cache=cache.setdefault(f"branches.{i}", {}), commit=c)
            out, branch_aux = call_op(b, x, **kw)
            outs.append(out)
            aux += branch_aux
        y = self._combine(outs)
        return (y, aux) if return_aux else y

    def _combine(self, outs: list[torch.Tensor]) -> torch.Tensor:
        if hasattr(self, "norms"):
            outs = [norm(o) for norm, o in zip(self.norms, outs)]
        if hasattr(self, "scale"):
            outs = [o * s for o, s in zip(outs, self.scale)]
        if self.combine == "concat":
            return self.proj(torch.cat(outs, dim=-1))
        total = torch.stack(outs).sum(0)
        return total / len(outs) if self.combine == "mean" else total


class Switch(nn.Module):
    """Holds every option's weights and runs the one the placement sampler picked; while
    decoding, option ``j`` reads ``cache["options.{j}"]``."""

    def __init__(self, spec: SwitchSpec, ctx: BuildCtx):
        super().__init__()
        self.options = nn.ModuleList(build_op(o, ctx) for o in spec.options)

    returns_aux = True  # builders.registry.call_op: the auxiliary losses of the option that ran

    def forward(self, x: torch.Tensor, option: int = 0, cache: dict | None = None, commit: bool = True,
                return_aux: bool = False, **overrides):
        if cache is not None:
            overrides.update(cache=cache.setdefault(f"options.{option}", {}), commit=commit)
        out, aux = call_op(self.options[option], x, **overrides)
        return (out, aux) if return_aux else out


register(ParallelSpec)(Parallel)
register(SwitchSpec)(Switch)

__all__ = ["Parallel", "Switch", "make_norm"]
