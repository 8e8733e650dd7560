"""The exact cost model of a canonical spec: parameters, projection compute, sequence
mixing, training FLOPs and inference memory. Pure functions over specs; no torch.

Conventions, derived where each quantity is computed:

- One FLOP is one multiply or one add, so a weight of ``a × b`` applied to one token costs
  ``2ab``: projection compute is 2 × parameters per token.
- *Projection compute* (MixerLoop §3.3): ``C_A`` = 2 × every parameter of a mixer (convs,
  a/b projections, ``A_log``, gate norms included: the paper counts "all mixer
  parameters"), ``C_F`` = 2 × the FFN's *active* parameters (MoE: router + ``top_k``
  experts + the shared expert; the later iterations of a routing-replay region reuse the
  first one's routing and skip the router), ``C_H = 2·V·d`` (the embedding lookup is
  free). Pre-norms and the final norm are elementwise, not projections, and are not
  counted. Each op is charged once per application in the execution plan, so NoLoop
  ``L(C_A + C_F) + C_H``, MixerLoop ``L(T·C_A + C_F) + C_H`` and FullLoop
  ``T·L(C_A + C_F) + C_H`` are special cases.
- Loop-extra matmuls (ELR's gated step, concat re-injection) are reported apart from
  projection compute; elementwise extras (ρ, diagonal re-injection, conditioning tables,
  iteration norms) cost no FLOPs. Each rule states its parameters and FLOPs once, in its
  :mod:`nas.rules` module.
- Training FLOPs are a forward plus a backward of twice the forward, except that a region
  with ``truncate: n`` backpropagates through its last n iterations only; with elastic
  depth they are the expectation over the loop-count distribution (exact probabilities).
- FLOPs are per token of one forward pass. ``loops=k`` replaces every region's ``T`` by
  ``k``, as :func:`nas.plan.plan` does.
- A ``switch`` mixer (random placement) costs the *expected* FLOPs of its options, each
  weighted by its canonical ``weights`` entry: the probability that the placement sampler
  runs it in that layer (``count/L`` for ratio sampling, ``ratio_i/Σ ratio`` for uniform);
  its memory is the *largest* option's, the amount to provision.
- Inference memory is what decoding keeps per sequence: KV caches at the model's dtype,
  recurrent matrix states in float32 at least (as fla keeps them in bf16 models), short-conv
  tails at the model's dtype (:func:`op_state_bytes`).

Parameter names match the compiled model: ``embed``, ``lm_head`` (untied only),
``layers.{i}.mixer_norm``, ``layers.{i}.mixer``, ``layers.{i}.ffn_norm``,
``layers.{i}.ffn`` (norm and FFN absent for kind ``none``), ``norm``, ``rho``,
``loops.{j}.*``.
"""
from .counting import Counts, counts, layer_choices, mixer_settings, switch_weights, with_override
from .ops import (
    mean_blocks, mean_keys, moe_params, op_active_params, op_kv_elements, op_params,
    op_projection_flops, op_seq_flops, op_state_bytes, op_state_elements,
)
from ..metrics import COST_METRICS
from .sheet import (
    DEFAULT_SEQ_LEN, DTYPE_BYTES, CostSheet, ExtraCost, Figures, OpCost, ProjectionFlops,
    cost, embedding_params, figures_at, norm_params, projection_flops, sheet_value, train_flops_at,
    unique_params,
)

__all__ = [
    "COST_METRICS", "CostSheet", "Counts", "ExtraCost", "Figures", "OpCost", "ProjectionFlops",
    "DEFAULT_SEQ_LEN", "DTYPE_BYTES", "cost", "counts", "embedding_params", "figures_at", "layer_choices",
    "mean_blocks", "mean_keys", "mixer_settings", "moe_params", "norm_params",
    "op_active_params", "op_kv_elements", "op_params", "op_projection_flops",
    "op_seq_flops", "op_state_bytes", "op_state_elements", "projection_flops", "switch_weights",
    "sheet_value", "train_flops_at", "unique_params", "with_override",
]
