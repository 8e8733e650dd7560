"""nn.Modules whose parameter names and shapes are those of fla's layers."""
from .attention import Attention, DeepSeekSparseAttention, NativeSparseAttention
from .ffn import MoE, SwiGLU, make_fla_swiglu
from .fla_runtime import FlaUnavailableError
from .linear_mixers import (
    DeltaNetTorch, GatedDeltaNetTorch, KimiDeltaAttentionTorch, Mamba2Torch, TORCH_LAYERS, make_fla,
)

__all__ = ["Attention", "DeepSeekSparseAttention", "DeltaNetTorch", "FlaUnavailableError", "GatedDeltaNetTorch",
           "KimiDeltaAttentionTorch", "Mamba2Torch", "MoE", "NativeSparseAttention", "SwiGLU",
           "TORCH_LAYERS", "make_fla", "make_fla_swiglu"]
