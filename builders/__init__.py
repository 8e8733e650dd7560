"""The compiler: canonical spec → PyTorch causal LM (torch or fla backend)."""
from .model import Block, LMOutput, LoopLM, build_model, resolve_backend
from .registry import BuildCtx, build_op, register, registered

__all__ = ["Block", "BuildCtx", "LMOutput", "LoopLM", "build_model", "build_op", "register",
           "registered", "resolve_backend"]
