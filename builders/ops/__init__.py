"""Functional operators in pure PyTorch, each with a naive reference (tests/)."""
from .attention import apply_rotary, attention, dsa_attention, masked_attention, nsa_attention
from .conv import causal_conv1d
from .linear import chunk_delta_rule, chunk_gated_delta_rule, chunk_kda, chunk_ssd
from .norm import l2_norm, rms_norm, rms_norm_gated

__all__ = ["apply_rotary", "attention", "causal_conv1d", "chunk_delta_rule", "chunk_gated_delta_rule",
           "chunk_kda", "chunk_ssd", "dsa_attention", "l2_norm", "masked_attention", "nsa_attention",
           "rms_norm", "rms_norm_gated"]
