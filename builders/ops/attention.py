"""Softmax-attention-family ops on ``(B, T, H, D)`` tensors, in plain PyTorch.

Boolean masks mean True = may attend. Queries are the last ``Tq`` of ``Tk`` positions.
The sparse ops (DSA, NSA) materialise dense ``(T, T)`` masks: they reproduce the
selection semantics of fla's naive references exactly, not the kernels' memory savings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "apply_rotary",
    "attention",
    "causal_mask",
    "dsa_attention",
    "dsa_index_scores",
    "dsa_select",
    "masked_attention",
    "mean_pool",
    "nsa_attention",
    "nsa_compression",
    "nsa_select_blocks",
    "nsa_selection",
    "rotary_tables",
]


def _check_heads(q: Tensor, k: Tensor) -> None:
    hq, hk = q.shape[2], k.shape[2]
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")


def causal_mask(t_q: int, t_k: int, window: int | None = None, device=None) -> Tensor:
    """(Tq, Tk) bool: query i (absolute position i + Tk - Tq) sees keys i-w+1..i."""
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    j = torch.arange(t_k, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask = mask & (i - j < window)
    return mask


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None,
          is_causal: bool = False) -> Tensor:
    """SDPA in (B, T, H, D) layout; GQA through ``enable_gqa``."""
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=q.shape[2] != k.shape[2],
    )  # (B, HQ, Tq, Dv)
    return o.transpose(1, 2)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
              window: int | None = None, scale: float | None = None) -> Tensor:
    """Softmax attention. q (B, Tq, HQ, D), k (B, Tk, H, D), v (B, Tk, H, Dv) -> (B, Tq, HQ, Dv).

    ``window=w`` lets query t see keys t-w+1..t (fla / flash-attn ``(w-1, 0)``).
    """
    _check_heads(q, k)
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal=True")
    t_q, t_k = q.shape[1], k.shape[1]
    if not causal:
        return _sdpa(q, k, v, None, scale)
    if window is None and t_q == t_k:
        return _sdpa(q, k, v, None, scale, is_causal=True)  # lets SDPA pick a fused kernel
    return _sdpa(q, k, v, causal_mask(t_q, t_k, window, q.device), scale)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *,
                     scale: float | None = None) -> Tensor:
    """Attention under an arbitrary bool mask broadcastable to (B, HQ, Tq, Tk).

    Rows with no visible key return zeros (fla's NSA convention), never NaN.
    """
    _check_heads(q, k)
    mask = mask.reshape((1,) * (4 - mask.dim()) + mask.shape)  # (B|1, HQ|1, Tq, Tk)
    empty = ~mask.any(-1, keepdim=True)  # (B|1, HQ|1, Tq, 1)
    o = _sdpa(q, k, v, mask | empty, scale)  # (B, Tq, HQ, Dv)
    return o.masked_fill(empty.transpose(1, 2), 0.0)


def rotary_tables(t: int, dim: int, theta: float, offset: int = 0,
                  device=None) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (T, dim / 2) in float32, built exactly as fla's RotaryEmbedding."""
    inv_freq = 1.0 / (float(theta) ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    pos = torch.arange(offset, offset + t, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)  # (T, dim / 2)
    return freqs.cos(), freqs.sin()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, H, D / 2) each: GPT-NeoX halves, not pairs
    cos, sin = cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None]  # (T, 1, D / 2)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def apply_rotary(q: Tensor, k: Tensor, theta: float, offset: int = 0) -> tuple[Tensor, Tensor]:
    """Rotary embedding on (B, T, H, D) q and k at positions offset..offset+T-1.

    Matches fla's ``RotaryEmbedding(dim=D, base=theta)`` (non-interleaved, fp32 tables
    cast to the input dtype).
    """
    d = q.shape[-1]
    if d % 2 or k.shape[-1] != d:
        raise ValueError(f"rotary needs an even head dim shared by q and k, got {d}, {k.shape[-1]}")
    cos, sin = rotary_tables(q.shape[1], d, theta, offset, q.device)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def dsa_index_scores(q_idx: Tensor, k_idx: Tensor, w_idx: Tensor | None = None, *,
                     scale: float | None = None) -> Tensor:
    """Lightning-indexer scores, unmasked: (B, T, T).

    ``I[t, s] = sum_j w[t, j] * relu(scale * q_idx[t, j] . k_idx[s])``; q_idx (B, T, HI, DI),
    k_idx (B, T, DI) shared across index heads, w_idx (B, T, HI) or None (weight 1).
    """
    scale = q_idx.shape[-1] ** -0.5 if scale is None else scale
    s = F.relu(torch.einsum("bthd,bsd->bths", q_idx, k_idx) * scale)  # (B, T, HI, T)
    if w_idx is None:
        return s.sum(2)
    return torch.einsum("bths,bth->bts", s, w_idx)


def dsa_select(scores: Tensor, topk: int, window: int | None = None) -> Tensor:
    """Keep mask (B, T, T): each query's ``topk`` best causal (windowed) keys, all when fewer."""
    t = scores.shape[-1]
    allowed = causal_mask(t, t, window, scores.device)  # (T, T)
    idx = scores.masked_fill(~allowed, float("-inf")).topk(min(topk, t), dim=-1).indices
    keep = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    # topk may pick masked (-inf) keys when fewer than topk are visible: drop them
    return keep.scatter_(-1, idx, True) & allowed


def dsa_attention(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, k_idx: Tensor,
                  w_idx: Tensor | None = None, *, topk: int, scale: float | None = None,
                  index_scale: float | None = None, window: int | None = None) -> Tensor:
    """DeepSeek sparse attention: softmax over each query's top-k indexer keys.

    Same selection as fla's ``naive_dsa`` (relu indexer, ``index_scale`` defaults to
    DI^-0.5) plus an optional causal window. The top-k is not differentiable, so no
    gradient reaches q_idx / k_idx / w_idx from the output.
    """
    with torch.no_grad():
        keep = dsa_select(dsa_index_scores(q_idx, k_idx, w_idx, scale=index_scale), topk, window)
    return masked_attention(q, k, v, keep[:, None], scale=scale)  # mask (B, 1, T, T)


def mean_pool(x: Tensor, block_size: int) -> Tensor:
    """Block means (B, T, H, D) -> (B, ceil(T / bs), H, D); a short last block uses its own length."""
    b, t = x.shape[:2]
    n = -(-t // block_size)
    x = F.pad(x, (0, 0, 0, 0, 0, n * block_size - t))
    sums = x.view(b, n, block_size, *x.shape[2:]).sum(2)  # (B, TC, H, D)
    counts = (t - torch.arange(n, device=x.device) * block_size).clamp(max=block_size)
    return sums / counts.to(x.dtype)[:, None, None]


def _block_visibility(t: int, n_blocks: int, block_size: int, device) -> Tensor:
    """(T, TC) bool: compressed block c is visible once its last token is in the past."""
    i_t = torch.arange(t, device=device)[:, None]
    i_c = torch.arange(n_blocks, device=device)[None, :]
    return (i_c + 1) * block_size - 1 <= i_t


def nsa_compression(q: Tensor, k_cmp: Tensor, v_cmp: Tensor, block_size: int,
                    scale: float | None = None) -> Tensor:
    """Compressed branch: attention over fully-past block means; zeros before the first block ends."""
    visible = _block_visibility(q.shape[1], k_cmp.shape[1], block_size, q.device)
    return masked_attention(q, k_cmp, v_cmp, visible, scale=scale)


def nsa_select_blocks(q: Tensor, k_cmp: Tensor, block_counts: int | Tensor, block_size: int,
                      scale: float | None = None) -> Tensor:
    """Top-n block indices (B, T, H, S), padded with -1, as fla's ``naive_nsa_topk``.

    Blocks rank by compressed-attention probability averaged over each query group;
    the first, current and previous blocks are forced in. ``block_counts`` is an int
    or a (B, T, H) tensor of per-query quotas.
    """
    b, t, hq, d = q.shape
    h, n_blk = k_cmp.shape[2], k_cmp.shape[1]
    scale = d ** -0.5 if scale is None else scale
    visible = _block_visibility(t, n_blk, block_size, q.device)  # (T, TC)
    i_blk = torch.arange(t, device=q.device)[:, None] // block_size
    i_c = torch.arange(n_blk, device=q.device)[None, :]
    forced = (i_c == i_blk) | (i_c == 0) | (i_c == i_blk - 1)  # (T, TC)
    with torch.no_grad():
        k_rep = k_cmp.repeat_interleave(hq // h, dim=2)  # (B, TC, HQ, D)
        logits = torch.einsum("bthd,bchd->bthc", q, k_rep) * scale
        probs = logits.masked_fill(~visible[:, None], float("-inf")).softmax(-1)
        probs = probs.nan_to_num(0.0).view(b, t, h, hq // h, n_blk).mean(3)  # (B, T, H, TC)
        probs = torch.where(forced[:, None], 1.0, probs)
    return _pad_top(probs, visible | forced, block_counts)


def _pad_top(scores: Tensor, allowed: Tensor, block_counts: int | Tensor) -> Tensor:
    """Top-S of scores (B, T, H, TC) kept if allowed (T, TC) and within quota; -1 elsewhere."""
    n_sel = block_counts if torch.is_tensor(block_counts) else torch.full(scores.shape[:3], block_counts)
    n_sel = n_sel.to(scores.device, torch.long)
    s = int(n_sel.max()) if n_sel.numel() else 0
    top = scores.topk(min(s, scores.shape[-1]), dim=-1).indices  # (B, T, H, S')
    ok = allowed[:, None].expand_as(scores).gather(-1, top)
    ok = ok & (torch.arange(top.shape[-1], device=top.device) < n_sel[..., None])
    sel = torch.where(ok, top, -1)
    return F.pad(sel, (0, s - sel.shape[-1]), value=-1)


def nsa_selection(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, block_size: int,
                  scale: float | None = None) -> Tensor:
    """Selected branch: causal attention over the tokens of each query's chosen blocks.

    block_indices (B, T, H, S) per kv head, -1 = empty slot; shared by the head's query group.
    """
    b, t, hq = q.shape[:3]
    h = k.shape[2]
    n_blk = -(-t // block_size)
    slots = block_indices.masked_fill(block_indices < 0, n_blk)  # -1 -> a dummy column
    blocks = torch.zeros(b, t, h, n_blk + 1, dtype=torch.bool, device=q.device)
    blocks = blocks.scatter_(-1, slots, True)[..., :n_blk]  # (B, T, H, TC)
    tokens = blocks.repeat_interleave(block_size, dim=-1)[..., :t]  # (B, T, H, T)
    tokens = tokens & causal_mask(t, t, device=q.device)[:, None]
    mask = tokens.transpose(1, 2).repeat_interleave(hq // h, dim=1)  # (B, HQ, T, T)
    return masked_attention(q, k, v, mask, scale=scale)


def nsa_attention(q: Tensor, k: Tensor, v: Tensor, g_cmp: Tensor | None = None,
                  g_slc: Tensor | None = None, g_swa: Tensor | None = None, *,
                  block_counts: int | Tensor = 16, block_size: int = 64, window: int | None = 0,
                  scale: float | None = None, block_indices: Tensor | None = None) -> Tensor:
    """Native sparse attention with fla ``naive_nsa`` semantics, vectorised.

    ``o = g_slc * o_slc + g_cmp * o_cmp + g_swa * o_swa`` with gates (B, T, HQ) already
    squashed. Without ``g_cmp`` the compressed branch is skipped and ``block_indices``
    must be given; ``window`` of 0 / None skips the sliding branch.
    """
    _check_heads(q, k)
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    o_cmp = None
    if g_cmp is not None:
        k_cmp, v_cmp = mean_pool(k, block_size), mean_pool(v, block_size)
        o_cmp = nsa_compression(q, k_cmp, v_cmp, block_size, scale)
        if block_indices is None:
            block_indices = nsa_select_blocks(q, k_cmp, block_counts, block_size, scale)
    if block_indices is None:
        raise ValueError("nsa_attention needs g_cmp (to select blocks) or block_indices")
    o = nsa_selection(q, k, v, block_indices, block_size, scale)
    if g_slc is not None:
        o = o * g_slc.unsqueeze(-1)
    if o_cmp is not None:
        o = o + o_cmp * g_cmp.unsqueeze(-1)
    if window:
        o_swa = attention(q, k, v, window=window, scale=scale)
        o = o + (o_swa if g_swa is None else o_swa * g_swa.unsqueeze(-1))
    return o
