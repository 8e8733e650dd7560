"""Softmax-attention mixers ``attn``, ``dsa``, ``nsa`` in torch, and fla's twins via ``make_fla``.

The torch layers keep fla's constructor kwargs and parameter names, so a ``state_dict``
moves between backends unchanged. Every ``forward(x, window=None, *, cache=None, commit=True)``
maps (B, T, D) to (B, T, D); ``window`` overrides the layer's window for one call: None keeps
it, ``"full"`` removes it, an int replaces it (loop schedules such as full -> 512 -> 256).
``cache`` is an incremental-decoding dict (``builders.cache``): keys and values live under
``kv.``; under a window only the last ``window`` of them are kept, so a cache sized for one
window cannot serve a wider one (each scheduled application keeps its own dict, or a shared
dict says with its ``keep`` entry how many keys to keep, None for all).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Literal

import torch
from torch import Tensor, nn

from builders.cache import cache_pos
from builders.layers.fla_runtime import install_interpreter_shims, require
from builders.ops.attention import (
    apply_rotary,
    attention,
    dsa_indexer_loss,
    dsa_topk,
    mean_pool,
    nsa_attention,
    sparse_attention,
)

__all__ = ["Attention", "DSAIndexer", "DeepSeekSparseAttention", "NativeSparseAttention", "make_fla"]

Window = int | Literal["full"] | None


def resolve_window(own: int | None, override: Window) -> int | None:
    """The window for one call: None keeps the layer's own, "full" removes it."""
    if override is None:
        return own
    return None if override == "full" else override


def _nsa_window(own: int | None, override: Window, t: int) -> int:
    """NSA's window branch is off at 0 / None, so "full" means a window spanning all T."""
    return t if override == "full" else resolve_window(own, override) or 0


def _kv_heads(num_heads: int, num_kv_heads: int | None) -> int:
    kv = num_heads if num_kv_heads is None else num_kv_heads
    if num_heads % kv:
        raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({kv})")
    return kv


def _heads(x: Tensor, head_dim: int) -> Tensor:
    return x.unflatten(-1, (-1, head_dim))  # (B, T, H * D) -> (B, T, H, D)


def _past(cache: dict, names: tuple[str, ...], window: int | None) -> tuple[int, list[Tensor | None]]:
    """The position and cached tensors (B, n, ...) of ``cache``, checked to cover ``window``."""
    pos, past = cache_pos(cache), [cache.get(name) for name in names]
    kept = 0 if past[0] is None else past[0].shape[1]
    if kept < pos and (window is None or kept < min(pos, window - 1)):
        need = "all" if window is None else f"the last {window - 1}"
        raise ValueError(f"this cache keeps the last {kept} of {pos} keys, but a call with window={window} "
                         f"needs {need}: use one cache dict per window")
    return pos, past


def _extend(past: Tensor | None, new: Tensor) -> Tensor:
    return new if past is None else torch.cat([past, new], dim=1)


def _commit(cache: dict, t: int, window: int | None, **tensors: Tensor) -> None:
    """Store the extended tensors and advance pos. Only the last ``window`` are kept, or the
    last ``cache["keep"]`` where the dict has that entry (None: all): a dict shared by loop
    iterations of different windows keeps what the widest of them reads."""
    keep = cache["keep"] if "keep" in cache else window
    for name, full in tensors.items():
        if keep is not None and full.shape[1] > keep:
            full = full[:, -keep:].clone()  # a copy, so the dropped keys are freed
        cache[f"kv.{name}"] = full
    cache["pos"] = cache_pos(cache) + t


class Attention(nn.Module):
    """Softmax attention, fla ``Attention`` kwargs and parameters, plus two options fla lacks.

    ``head_dim`` (default hidden_size // num_heads, fla's only choice) and
    ``output_gate``: Qwen3-Next gated attention, ``o = o * sigmoid(g_proj(x))`` per head
    and channel after SDPA, before ``o_proj``. ``rope_theta=None`` drops rotary (NoPE).
    ``max_position_embeddings`` and ``layer_idx`` only size fla's caches; kept for parity.
    Beyond fla: ``qk_norm_module(size)`` makes q_norm/k_norm (default fla's RMSNorm, eps
    1e-5); ``qk_norm_over="heads"`` normalises the whole q and k projections (OLMo 2)
    instead of each head; ``rope_dim`` rotates only the first ``rope_dim`` channels of
    each head (partial rotary, frequencies over ``rope_dim``).
    """

    def __init__(self, hidden_size: int = 2048, num_heads: int = 32, num_kv_heads: int | None = None,
                 qkv_bias: bool = False, qk_norm: bool = False, window_size: int | None = None,
                 rope_theta: float | None = 10000., max_position_embeddings: int | None = None,
                 layer_idx: int | None = None, *, head_dim: int | None = None, output_gate: bool = False,
                 qk_norm_module=None, qk_norm_over: str = "head", rope_dim: int | None = None):
        super().__init__()
        self.num_kv_heads = _kv_heads(num_heads, num_kv_heads)
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim = hidden_size // num_heads if head_dim is None else head_dim
        self.qkv_bias, self.qk_norm, self.output_gate = qkv_bias, qk_norm, output_gate
        self.window_size, self.rope_theta = window_size, rope_theta
        self.max_position_embeddings, self.layer_idx = max_position_embeddings, layer_idx
        q_dim, kv_dim = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden_size, q_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, kv_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(q_dim, hidden_size, bias=False)
        self.qk_norm_over, self.rope_dim = qk_norm_over, rope_dim
        if qk_norm:  # fla: RMSNorm(head_dim, eps=1e-5) in fp32, weight named `weight`
            make = qk_norm_module or functools.partial(nn.RMSNorm, eps=1e-5)
            over = qk_norm_over == "heads"
            self.q_norm = make(q_dim if over else self.head_dim)
            self.k_norm = make(kv_dim if over else self.head_dim)
        if output_gate:
            self.g_proj = nn.Linear(hidden_size, q_dim, bias=False)

    def project(self, x: Tensor, offset: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) at positions offset.. -> q (B, T, HQ, d), k and v (B, T, H, d): normed, rotated."""
        if self.qk_norm and self.qk_norm_over == "heads":  # over the projections, before the head split
            q, k = self.q_norm(self.q_proj(x)), self.k_norm(self.k_proj(x))
            q, k, v = _heads(q, self.head_dim), _heads(k, self.head_dim), _heads(self.v_proj(x), self.head_dim)
        else:
            q, k, v = (_heads(p(x), self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
        if self.rope_theta is not None and self.rope_dim not in (None, self.head_dim):
            r = self.rope_dim  # partial rotary: the first r channels of each head
            q_rot, k_rot = apply_rotary(q[..., :r], k[..., :r], self.rope_theta, offset)
            q, k = torch.cat([q_rot, q[..., r:]], -1), torch.cat([k_rot, k[..., r:]], -1)
        elif self.rope_theta is not None:
            q, k = apply_rotary(q, k, self.rope_theta, offset)
        return q, k, v

    def output(self, x: Tensor, o: Tensor) -> Tensor:
        """o (B, T, HQ, d) -> (B, T, D), through the output gate when there is one."""
        if self.output_gate:
            o = o * torch.sigmoid(_heads(self.g_proj(x), self.head_dim))
        return self.o_proj(o.flatten(2))

    def forward(self, x: Tensor, window: Window = None, *, cache: dict | None = None,
                commit: bool = True) -> Tensor:
        w = resolve_window(self.window_size, window)
        if cache is None:
            q, k, v = self.project(x)
            return self.output(x, attention(q, k, v, window=w))
        pos, (k_past, v_past) = _past(cache, ("kv.k", "kv.v"), w)
        q, k, v = self.project(x, pos)
        k, v = _extend(k_past, k), _extend(v_past, v)  # (B, n + t, H, d): queries are the last t
        if commit:
            _commit(cache, x.shape[1], w, k=k, v=v)
        return self.output(x, attention(q, k, v, window=w))


class DSAIndexer(nn.Module):
    """DeepSeek-V3.2 lightning indexer: ``index_heads`` queries against one shared key."""

    def __init__(self, hidden_size: int, index_heads: int, index_head_dim: int):
        super().__init__()
        self.index_heads, self.index_head_dim = index_heads, index_head_dim
        self.q_proj = nn.Linear(hidden_size, index_heads * index_head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, index_head_dim, bias=False)
        self.weights_proj = nn.Linear(hidden_size, index_heads, bias=False)

    def forward(self, x: Tensor, rope_theta: float | None, offset: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) at positions offset.. -> index queries (B, T, HI, DI), keys (B, T, DI) and
        head weights (B, T, HI), scaled by HI^-0.5 as in V3.2; ``dsa_topk`` scores them."""
        q = _heads(self.q_proj(x), self.index_head_dim)  # (B, T, HI, DI)
        k = self.k_proj(x).unsqueeze(2)  # (B, T, 1, DI)
        if rope_theta is not None:
            q, k = apply_rotary(q, k, rope_theta, offset)
        return q, k.squeeze(2), self.weights_proj(x) * self.index_heads ** -0.5


class DeepSeekSparseAttention(Attention):
    """DSA: multi-head attention where each query attends to its ``topk`` indexer-chosen keys.

    Our design (fla has no DSA layer): ``Attention``'s projections plus ``indexer``
    (``q_proj``, ``k_proj``, ``weights_proj``). The top-k passes no gradient, so, as in
    DeepSeek-V3.2, the indexer learns only from its auxiliary loss, returned by a training
    forward called with ``return_aux=True`` (``(out, [loss])``; ``[]`` in eval):
    KL(head-summed attention of the main heads || softmax of the index scores) over the
    selected keys, with the indexer's input and target detached.
    Selection, attention and loss run blockwise over gathered keys: no (T, T) tensor.
    A decoding cache holds keys, values and indexer keys (``kv.k``, ``kv.v``,
    ``kv.index_k``), only the last ``window`` of them under a window.
    """

    def __init__(self, hidden_size: int = 2048, num_heads: int = 32, num_kv_heads: int | None = None,
                 qkv_bias: bool = False, qk_norm: bool = False, window_size: int | None = None,
                 rope_theta: float | None = 10000., max_position_embeddings: int | None = None,
                 layer_idx: int | None = None, *, head_dim: int | None = None, output_gate: bool = False,
                 index_heads: int = 4, index_head_dim: int = 32, topk: int = 64):
        super().__init__(hidden_size, num_heads, num_kv_heads, qkv_bias, qk_norm, window_size, rope_theta,
                         max_position_embeddings, layer_idx, head_dim=head_dim, output_gate=output_gate)
        self.topk = topk
        self.indexer = DSAIndexer(hidden_size, index_heads, index_head_dim)

    returns_aux = True  # builders.registry.call_op

    def forward(self, x: Tensor, window: Window = None, topk: int | None = None, *,
                cache: dict | None = None, commit: bool = True,
                return_aux: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        w, topk = resolve_window(self.window_size, window), self.topk if topk is None else topk
        if cache is None:
            (q, k, v), (q_i, k_i, w_i) = self.project(x), self.indexer(x.detach(), self.rope_theta)
        else:
            pos, (k_past, v_past, i_past) = _past(cache, ("kv.k", "kv.v", "kv.index_k"), w)
            (q, k, v), (q_i, k_i, w_i) = self.project(x, pos), self.indexer(x.detach(), self.rope_theta, pos)
            k, v, k_i = _extend(k_past, k), _extend(v_past, v), _extend(i_past, k_i)
            if commit:
                _commit(cache, x.shape[1], w, k=k, v=v, index_k=k_i)
        with torch.no_grad():
            idx, valid = dsa_topk(q_i, k_i, w_i, topk=topk, window=w)  # (B, T, K) each
        out = self.output(x, sparse_attention(q, k, v, idx, valid))
        if not return_aux:
            return out
        return out, ([dsa_indexer_loss(q, k, q_i, k_i, w_i, idx, valid)] if self.training else [])


_NSA_CACHE = ("kv.k", "kv.v", "kv.k_cmp", "kv.v_cmp")


class NativeSparseAttention(nn.Module):
    """NSA with fla ``NativeSparseAttention`` kwargs and parameter names (q/k/v/g/o_proj).

    ``g_proj`` gives three sigmoid gates per head, in order compressed, selected, window.
    fla's kernels also need num_heads / num_kv_heads a power of two >= 16; this layer
    does not. ``rope_theta=None`` drops rotary (fla cannot). Runs blockwise (no (T, T)
    tensor). A decoding cache holds every key and value (a selected block may lie anywhere
    in the past) and the means of the completed blocks (``kv.k_cmp``, ``kv.v_cmp``).
    """

    def __init__(self, hidden_size: int = 2048, num_heads: int = 64, num_kv_heads: int | None = 4,
                 head_dim: int = 64, qkv_bias: bool = False, block_size: int = 64,
                 block_counts: int | Tensor = 16, window_size: int | None = 512,
                 rope_theta: float | None = 10000., max_position_embeddings: int | None = None,
                 layer_idx: int | None = None):
        super().__init__()
        self.num_kv_heads = _kv_heads(num_heads, num_kv_heads)
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.qkv_bias, self.rope_theta = qkv_bias, rope_theta
        self.block_size, self.block_counts, self.window_size = block_size, block_counts, window_size
        self.max_position_embeddings, self.layer_idx = max_position_embeddings, layer_idx
        q_dim, kv_dim = num_heads * head_dim, self.num_kv_heads * head_dim
        self.q_proj = nn.Linear(hidden_size, q_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, kv_dim, bias=qkv_bias)
        self.g_proj = nn.Linear(hidden_size, num_heads * 3, bias=False)
        self.o_proj = nn.Linear(q_dim, hidden_size, bias=False)

    def forward(self, x: Tensor, window: Window = None, *, cache: dict | None = None,
                commit: bool = True) -> Tensor:
        pos, past = (0, [None] * 4) if cache is None else _past(cache, _NSA_CACHE, None)
        q, k, v = (_heads(p(x), self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.rope_theta is not None:
            q, k = apply_rotary(q, k, self.rope_theta, pos)
        k, v = _extend(past[0], k), _extend(past[1], v)
        k_cmp = v_cmp = None
        if cache is not None:  # pool the blocks completed by x onto the cached block means
            bs, done = self.block_size, pos // self.block_size * self.block_size
            end = k.shape[1] // bs * bs
            k_cmp, v_cmp = (_extend(old, mean_pool(new[:, done:end], bs)) for old, new in zip(past[2:], (k, v)))
            if commit:
                _commit(cache, x.shape[1], None, k=k, v=v, k_cmp=k_cmp, v_cmp=v_cmp)
        g_cmp, g_slc, g_swa = _heads(self.g_proj(x), 3).sigmoid().unbind(-1)  # (B, T, HQ) each
        o = nsa_attention(q, k, v, g_cmp, g_slc, g_swa, block_counts=self.block_counts, block_size=self.block_size,
                          window=_nsa_window(self.window_size, window, k.shape[1]), k_cmp=k_cmp, v_cmp=v_cmp)
        return self.o_proj(o.flatten(2))


def _rotary(layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """fla's RotaryEmbedding (a Triton kernel) at positions 0..T-1, as fla's forward calls it."""
    max_seqlen = max(q.shape[1], layer.max_position_embeddings or 0)
    return layer.rotary(q, k, seqlen_offset=0, max_seqlen=max_seqlen, cu_seqlens=None)


def _no_fla_cache(cache: dict | None) -> None:
    if cache is not None:
        raise NotImplementedError("the fla backend's attention layers do not decode incrementally: "
                                  "decode with backend='torch' (same parameters, same state_dict)")


class _FlaAttentionForward:
    """fla ``Attention``'s projections, qk norm and rotary; the softmax core is PyTorch SDPA.

    fla calls flash-attn there, which is not a dependency; SDPA dispatches to its own
    flash-attention kernel on recent GPUs. Returns o and takes a one-call window.
    """

    def forward(self, x: Tensor, window: Window = None, *, cache: dict | None = None,
                commit: bool = True) -> Tensor:
        _no_fla_cache(cache)
        require(x)
        q, k, v = (_heads(p(x), self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rotary(self, q, k)
        o = attention(q, k, v, window=resolve_window(self.window_size, window))  # (B, T, HQ, D)
        return self.o_proj(o.flatten(2))


class _FlaNSAForward:
    """fla NSA's compressed and selected branches (``parallel_nsa``); the window branch is SDPA.

    fla computes the window branch with flash-attn, which is not a dependency.
    """

    def forward(self, x: Tensor, window: Window = None, *, cache: dict | None = None,
                commit: bool = True) -> Tensor:
        _no_fla_cache(cache)
        require(x)
        from fla.ops.nsa import parallel_nsa

        q, k, v = (_heads(p(x), self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = _rotary(self, q, k)
        g_cmp, g_slc, g_swa = _heads(self.g_proj(x), 3).sigmoid().unbind(-1)  # (B, T, HQ) each
        o = parallel_nsa(q, k, v, g_cmp, g_slc, block_counts=self.block_counts, block_size=self.block_size)
        w = _nsa_window(self.window_size, window, x.shape[1])
        if w:
            o = o + attention(q, k, v, window=w) * g_swa.unsqueeze(-1)
        return self.o_proj(o.flatten(2))


def _missing_flash_attn(*args, **kwargs):
    raise ImportError("flash-attn is not installed")


@contextlib.contextmanager
def _flash_attn_stub(module):
    """fla's Attention refuses to build without flash-attn, though only its forward needs it."""
    if module.flash_attn_func is not None:
        yield
        return
    module.flash_attn_func = _missing_flash_attn
    try:
        yield
    finally:
        module.flash_attn_func = None


@functools.cache
def _fla_class(kind: str) -> type[nn.Module]:
    install_interpreter_shims()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla warns on import when Triton or flash-attn is absent
        from fla.layers.attn import Attention as FlaAttention
        from fla.layers.nsa import NativeSparseAttention as FlaNSA
    mixin, base = {"attn": (_FlaAttentionForward, FlaAttention), "nsa": (_FlaNSAForward, FlaNSA)}[kind]
    return type(f"Fla{base.__name__}", (mixin, base), {})


_TORCH = {"attn": Attention, "nsa": NativeSparseAttention}
_TORCH_EXTRAS = {"attn": ("head_dim", "output_gate", "qk_norm_module", "qk_norm_over", "rope_dim"),
                 "nsa": ()}  # our kwargs fla lacks


def _torch_only(kind: str, kw: dict) -> bool:
    """Options fla's layer has no equivalent for: the caller then gets the torch layer."""
    if kw.get("rope_theta", 1.0) is None:
        return True
    if kind == "nsa":
        return False
    default_dim = kw.get("hidden_size", 2048) // kw.get("num_heads", 32)
    ours = kw.get("qk_norm_module") is not None or kw.get("qk_norm_over", "head") != "head" \
        or kw.get("rope_dim") is not None
    return ours or bool(kw.get("output_gate")) or (kw.get("head_dim") or default_dim) != default_dim


def make_fla(kind: str, **kw) -> nn.Module:
    """fla's own ``attn`` / ``nsa`` layer (a subclass with our forward), built on any device.

    Same kwargs as the torch layers. Where fla has no equivalent (``output_gate``, a
    ``head_dim`` other than hidden_size // num_heads, ``rope_theta=None``) the fla
    backend falls back to the torch layer, whose parameters it would share anyway.
    Its forward runs fla's Triton kernels (CUDA, or the CPU under ``TRITON_INTERPRET=1``)
    and PyTorch SDPA where fla would call flash-attn, which need not be installed.
    """
    if kind not in _TORCH:
        raise ValueError(f"fla has no layer for kind {kind!r}; expected one of {sorted(_TORCH)}")
    if _torch_only(kind, kw):
        return _TORCH[kind](**kw)
    if kind == "nsa" and isinstance(kw.get("block_counts", 16), int) and kw.get("block_counts", 16) < 3:
        # the first, previous and current blocks are always selected; with fewer slots, which
        # of them the kernel keeps is an accident of its bitonic sort, not the torch twin's choice
        raise ValueError(f"fla's NSA needs block_counts >= 3 (got {kw['block_counts']}): "
                         "it always selects 3 blocks; use the torch backend for fewer")
    cls = _fla_class(kind)
    import fla.layers.attn as fla_attn

    fla_kw = {name: value for name, value in kw.items() if name not in _TORCH_EXTRAS[kind]}
    with _flash_attn_stub(fla_attn):
        return cls(**fla_kw)
