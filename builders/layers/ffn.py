"""Channel mixers: SwiGLU (fla ``GatedMLP`` parameters) and a top-k routed MoE of SwiGLUs."""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from builders.layers.fla_runtime import install_interpreter_shims, require

__all__ = ["MoE", "Routing", "SwiGLU", "make_fla_swiglu", "swiglu_hidden", "switch_aux_loss"]


def swiglu_hidden(hidden_size: int, hidden_ratio: float | None = None,
                  intermediate_size: int | None = None) -> int:
    """fla GatedMLP's width: int(hidden * ratio * 2 / 3), ratio 4, rounded up to a multiple of 256."""
    if intermediate_size is not None:
        return intermediate_size
    width = int(hidden_size * (4 if hidden_ratio is None else hidden_ratio) * 2 / 3)
    return 256 * -(-width // 256)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; kwargs and parameter names as fla's ``GatedMLP``."""

    def __init__(self, hidden_size: int, hidden_ratio: float | None = None,
                 intermediate_size: int | None = None):
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = swiglu_hidden(hidden_size, hidden_ratio, intermediate_size)
        self.gate_proj = nn.Linear(hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Routing(NamedTuple):
    """Top-k choice per token: expert ``indices`` (N, k) and mixing ``weights`` (N, k)."""

    indices: Tensor
    weights: Tensor

    def detach(self) -> Routing:
        """For replay in a later step, so it does not hold on to this step's graph."""
        return Routing(self.indices, self.weights.detach())


def switch_aux_loss(probs: Tensor, indices: Tensor) -> Tensor:
    """Switch-Transformer balance loss ``E * sum_e f_e * P_e``; 1 when perfectly balanced.

    f_e: share of the N * k assignments that went to expert e (no gradient);
    P_e: mean router probability of e over the N tokens. probs (N, E), indices (N, k).
    """
    n_experts = probs.shape[-1]
    counts = torch.bincount(indices.flatten(), minlength=n_experts)
    f = counts.to(probs.dtype) / indices.numel()
    return n_experts * (f * probs.mean(0)).sum()


class MoE(nn.Module):
    """Top-k routed SwiGLU experts, softmax router, optional always-on shared expert.

    Parameters: ``gate`` (router, Linear(D, E)), ``experts.{i}``, ``shared_expert``,
    ``shared_expert_gate`` (Linear(D, 1): the shared expert's output times its sigmoid).
    ``forward(x, routing=None, return_routing=False)``: with ``return_routing`` it returns
    ``(y, aux_loss, routing)``, the Switch balance loss (zero under replay) and the routing
    used, explicitly (no module state). ``routing`` replays a previous routing instead of
    routing afresh; its weights keep their graph (so a loop that replays within one step
    trains the router through them); call ``.detach()`` to replay across steps.
    """

    def __init__(self, hidden_size: int, num_experts: int = 8, top_k: int = 2,
                 expert_hidden: int | None = None, shared_expert_hidden: int = 0,
                 shared_expert_gate: bool = False):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must lie in 1..num_experts={num_experts}")
        self.num_experts, self.top_k = num_experts, top_k
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden_size, intermediate_size=expert_hidden)
                                     for _ in range(num_experts))
        self.shared_expert = None
        if shared_expert_hidden:
            self.shared_expert = SwiGLU(hidden_size, intermediate_size=shared_expert_hidden)
        if shared_expert_gate:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def route(self, x: Tensor) -> tuple[Routing, Tensor]:
        """x (N, D) -> top-k routing with weights renormalised over the k, and the aux loss."""
        logits = self.gate(x)
        probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)  # (N, E)
        top_w, top_i = probs.topk(self.top_k, dim=-1)  # (N, k)
        return Routing(top_i, top_w / top_w.sum(-1, keepdim=True)), switch_aux_loss(probs, top_i)

    def dispatch(self, x: Tensor, routing: Routing) -> Tensor:
        """sum_j w[n, j] * expert_{i[n, j]}(x[n]): tokens grouped per expert, one call each."""
        flat = routing.indices.flatten()  # (N * k,)
        order = flat.argsort(stable=True)
        tokens = order // routing.indices.shape[1]  # token of each assignment, grouped by expert
        weights = routing.weights.flatten()[order].to(x.dtype)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        y = torch.zeros_like(x)
        for expert, tok, w in zip(self.experts, tokens.split(counts), weights.split(counts)):
            if tok.numel():
                y.index_add_(0, tok, expert(x.index_select(0, tok)) * w[:, None])
        return y

    def forward(self, x: Tensor, routing: Routing | None = None, return_routing: bool = False
                ) -> Tensor | tuple[Tensor, Tensor, Routing]:
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        if routing is None:
            routing, aux = self.route(flat)
        elif routing.indices.shape != (flat.shape[0], self.top_k):
            raise ValueError(f"replayed routing has shape {tuple(routing.indices.shape)}, "
                             f"expected ({flat.shape[0]}, {self.top_k})")
        else:
            aux = flat.new_zeros(())
        y = self.dispatch(flat, routing)
        if self.shared_expert is not None:
            shared = self.shared_expert(flat)
            if hasattr(self, "shared_expert_gate"):
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            y = y + shared
        return (y.view_as(x), aux, routing) if return_routing else y.view_as(x)


class _FlaSwiGLUForward:
    def forward(self, x: Tensor) -> Tensor:
        require(x)
        return super().forward(x)


@functools.cache
def _fla_gated_mlp() -> type[nn.Module]:
    install_interpreter_shims()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla warns on import when Triton has no GPU
        from fla.modules import GatedMLP
    return type("FlaGatedMLP", (_FlaSwiGLUForward, GatedMLP), {})


def make_fla_swiglu(hidden_size: int, hidden_ratio: float | None = None,
                    intermediate_size: int | None = None) -> nn.Module:
    """fla's ``GatedMLP``: SwiGLU's parameters, its fused Triton ``swiglu_linear`` forward."""
    return _fla_gated_mlp()(hidden_size, hidden_ratio, intermediate_size)
