"""Softmax-attention-family ops on ``(B, T, H, D)`` tensors, in plain PyTorch.

Boolean masks mean True = may attend. Queries are the last ``Tq`` of ``Tk`` positions.
The sparse ops (``dsa_attention``, ``nsa_attention``) run blocks of ``chunk`` queries:
each block scores its visible keys (or compressed blocks), keeps its top-k, gathers only
the chosen keys and attends over them, so memory is linear in T at a fixed top-k. Their
``*_reference`` twins (and ``dsa_select``, ``nsa_select_blocks``, ``nsa_selection``,
``masked_attention``) build dense ``(T, T)`` masks with the selection semantics of fla's
naive references; the tests hold the blockwise ops to them.
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
    "dsa_attention_reference",
    "dsa_index_scores",
    "dsa_indexer_loss",
    "dsa_select",
    "dsa_topk",
    "masked_attention",
    "mean_pool",
    "nsa_attention",
    "nsa_attention_reference",
    "nsa_compression",
    "nsa_select_blocks",
    "nsa_selection",
    "rotary_tables",
    "sparse_attention",
    "topk_latest",
]

CHUNK = 128  # queries per block in the sparse ops


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

    ``window=w`` lets query t see keys t-w+1..t (fla / flash-attn ``(w-1, 0)``); a long
    sequence under a short window runs in query blocks over their own keys (no (T, T) mask).
    """
    _check_heads(q, k)
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal=True")
    t_q, t_k = q.shape[1], k.shape[1]
    if not causal:
        return _sdpa(q, k, v, None, scale)
    if window is None and t_q == t_k:
        return _sdpa(q, k, v, None, scale, is_causal=True)  # lets SDPA pick a fused kernel
    if window is not None and t_q > CHUNK and window + CHUNK < t_k:
        return _sliding_blocks(q, k, v, window, scale)
    return _sdpa(q, k, v, causal_mask(t_q, t_k, window, q.device), scale)


def _sliding_blocks(q: Tensor, k: Tensor, v: Tensor, window: int, scale: float | None) -> Tensor:
    """Sliding-window attention a block of queries at a time, each over its ``chunk + window - 1``
    keys: no (Tq, Tk) mask, memory linear in T."""
    t_q, t_k = q.shape[1], k.shape[1]
    out = []
    for s, e in _blocks(t_q, CHUNK):
        hi = t_k - t_q + e
        lo = max(0, hi - (e - s) - window + 1)
        mask = causal_mask(e - s, hi - lo, window, q.device)
        out.append(_sdpa(q[:, s:e], k[:, lo:hi], v[:, lo:hi], mask, scale))
    return torch.cat(out, 1)


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
    """Lightning-indexer scores, unmasked: (B, Tq, Tk).

    ``I[t, s] = sum_j w[t, j] * relu(scale * q_idx[t, j] . k_idx[s])``; q_idx (B, Tq, HI, DI),
    k_idx (B, Tk, DI) shared across index heads, w_idx (B, Tq, HI) or None (weight 1).
    """
    scale = q_idx.shape[-1] ** -0.5 if scale is None else scale
    b, t, hi, di = q_idx.shape
    s = torch.bmm(q_idx.reshape(b, t * hi, di), k_idx.transpose(1, 2)).view(b, t, hi, -1)  # (B, Tq, HI, Tk)
    s = s.mul_(scale).relu_()
    if w_idx is None:
        return s.sum(2)
    return torch.matmul(w_idx.unsqueeze(-2), s).squeeze(-2)  # (B, Tq, Tk)


def dsa_select(scores: Tensor, topk: int, window: int | None = None) -> Tensor:
    """Keep mask (B, T, T): each query's ``topk`` best causal (windowed) keys, all when fewer."""
    t = scores.shape[-1]
    allowed = causal_mask(t, t, window, scores.device)  # (T, T)
    idx = scores.masked_fill(~allowed, float("-inf")).topk(min(topk, t), dim=-1).indices
    keep = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    # topk may pick masked (-inf) keys when fewer than topk are visible: drop them
    return keep.scatter_(-1, idx, True) & allowed


def dsa_attention_reference(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, k_idx: Tensor,
                            w_idx: Tensor | None = None, *, topk: int, scale: float | None = None,
                            index_scale: float | None = None, window: int | None = None) -> Tensor:
    """DeepSeek sparse attention through dense (T, T) masks: the oracle of ``dsa_attention``.

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


def nsa_attention_reference(q: Tensor, k: Tensor, v: Tensor, g_cmp: Tensor | None = None,
                            g_slc: Tensor | None = None, g_swa: Tensor | None = None, *,
                            block_counts: int | Tensor = 16, block_size: int = 64, window: int | None = 0,
                            scale: float | None = None, block_indices: Tensor | None = None) -> Tensor:
    """Native sparse attention with fla ``naive_nsa`` semantics through dense (T, T) masks:
    the oracle of ``nsa_attention``.

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
        raise ValueError("nsa_attention_reference needs g_cmp (to select blocks) or block_indices")
    o = nsa_selection(q, k, v, block_indices, block_size, scale)
    if g_slc is not None:
        o = o * g_slc.unsqueeze(-1)
    if o_cmp is not None:
        o = o + o_cmp * g_cmp.unsqueeze(-1)
    if window:
        o_swa = attention(q, k, v, window=window, scale=scale)
        o = o + (o_swa if g_swa is None else o_swa * g_swa.unsqueeze(-1))
    return o


# Blockwise sparse attention: memory linear in T at a fixed top-k.

def _blocks(t: int, chunk: int):
    """(start, end) of consecutive query blocks of at most ``chunk`` rows."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return ((s, min(s + chunk, t)) for s in range(0, t, chunk))


def topk_latest(scores: Tensor, k: int, counts: Tensor | None = None) -> Tensor:
    """Positions of the ``k`` (or per-row ``counts`` <= k) largest ``scores`` (..., N), descending, -1 padded.

    ``torch.topk`` breaks ties as its algorithm happens to; here a tie goes to the later
    position, so a query keeps the same keys whether it is scored alone (decoding) or in a
    block of any size (exact zeros of the relu indexer tie often). Returns (..., min(k, N)).
    """
    k = min(k, scores.shape[-1])
    if k == 0:
        return scores.new_empty(*scores.shape[:-1], 0, dtype=torch.long)
    values, top = scores.topk(k, dim=-1)  # (..., k), values descending
    c = torch.full(scores.shape[:-1], k, device=scores.device) if counts is None else counts.clamp(max=k)
    c = c.to(scores.device, torch.long)[..., None]
    threshold = values.gather(-1, (c - 1).clamp(min=0))
    sel = torch.where(torch.arange(k, device=scores.device) < c, top, -1)
    # where exactly c scores reach the threshold the top-c set is unique; elsewhere the ties decide
    tied_rows = (((scores >= threshold).sum(-1, keepdim=True) != c) & (c > 0)).squeeze(-1).nonzero(as_tuple=True)
    if tied_rows[0].numel():
        sub, thr, room = scores[tied_rows], threshold[tied_rows], c[tied_rows]  # (R, N), (R, 1), (R, 1)
        above, tied = sub > thr, sub == thr
        later_ties = tied.flip(-1).cumsum(-1).flip(-1)  # ties at or after each position
        keep = above | (tied & (later_ties <= room - above.sum(-1, keepdim=True)))
        position = torch.arange(sub.shape[-1], device=sub.device)
        sel[tied_rows] = torch.where(keep, position, -1).topk(k, dim=-1).values
    return sel.sort(-1, descending=True).values


def _gather_time(x: Tensor, idx: Tensor) -> Tensor:
    """x (B, T, H, D) at positions idx (B, n, L, H|1), per head -> (B, n, L, H, D)."""
    b, n, length, h = idx.shape
    index = idx.reshape(b, n * length, h, 1).expand(b, n * length, x.shape[2], x.shape[3])
    return x.gather(1, index).view(b, n, length, *x.shape[2:])


def _attend(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, scale: float) -> Tensor:
    """Each query over its own keys: q (B, n, HQ, D), k, v (B, n, L, H, D), valid (B, n, L, H|1).

    Returns (B, n, HQ, Dv); a query with no valid key gets zeros, as ``masked_attention``.
    """
    b, n, hq, d = q.shape
    h = k.shape[3]
    logits = torch.einsum("bnhgd,bnlhd->bnhgl", q.view(b, n, h, hq // h, d), k) * scale
    mask = valid.permute(0, 1, 3, 2)[:, :, :, None]  # (B, n, H|1, 1, L)
    empty = ~mask.any(-1, keepdim=True)
    p = logits.masked_fill(~(mask | empty), float("-inf")).softmax(-1)
    o = torch.einsum("bnhgl,bnlhd->bnhgd", p, v).masked_fill(empty, 0.0)  # (B, n, H, G, Dv)
    return o.flatten(2, 3)


@torch.no_grad()
def dsa_topk(q_idx: Tensor, k_idx: Tensor, w_idx: Tensor | None = None, *, topk: int,
             window: int | None = None, scale: float | None = None, chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """Each query's ``topk`` best causal (windowed) keys, scored one query block at a time.

    q_idx (B, Tq, HI, DI) are the last Tq of the Tk keys k_idx (B, Tk, DI). Returns key
    positions (B, Tq, K) and which are valid (B, Tq, K), K = min(topk, Tk): a query sees
    all its keys when fewer than ``topk`` are visible. Ties go to the later key.
    """
    t_q, t_k = q_idx.shape[1], k_idx.shape[1]
    width = min(topk, t_k)
    idx, valid = [], []
    for s, e in _blocks(t_q, chunk):
        hi = t_k - t_q + e  # keys after the block's last query are never visible
        lo = 0 if window is None else max(0, hi - (e - s) - window + 1)
        allowed = causal_mask(e - s, hi - lo, window, q_idx.device)  # (n, L)
        w_blk = None if w_idx is None else w_idx[:, s:e]
        scores = dsa_index_scores(q_idx[:, s:e], k_idx[:, lo:hi], w_blk, scale=scale)  # (B, n, L)
        top = topk_latest(scores.masked_fill_(~allowed, float("-inf")), topk)  # (B, n, K')
        ok = allowed.expand_as(scores).gather(-1, top)
        pad = width - top.shape[-1]
        idx.append(F.pad(top + lo, (0, pad)))
        valid.append(F.pad(ok, (0, pad), value=False))
    return torch.cat(idx, 1), torch.cat(valid, 1)


def sparse_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, valid: Tensor, *,
                     scale: float | None = None, chunk: int = CHUNK) -> Tensor:
    """Softmax attention of each query over its own keys: idx, valid (B, Tq, K), shared by all heads.

    q (B, Tq, HQ, D), k (B, Tk, H, D), v (B, Tk, H, Dv) -> (B, Tq, HQ, Dv); only the
    chosen keys are gathered, one query block at a time.
    """
    _check_heads(q, k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = []
    for s, e in _blocks(q.shape[1], chunk):
        i = idx[:, s:e, :, None]  # (B, n, K, 1)
        out.append(_attend(q[:, s:e], _gather_time(k, i), _gather_time(v, i), valid[:, s:e, :, None], scale))
    return torch.cat(out, 1)


def dsa_attention(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, k_idx: Tensor,
                  w_idx: Tensor | None = None, *, topk: int, scale: float | None = None,
                  index_scale: float | None = None, window: int | None = None, chunk: int = CHUNK) -> Tensor:
    """DeepSeek sparse attention: softmax over each query's top-k indexer keys, blockwise.

    Same selection as fla's ``naive_dsa`` (relu indexer, ``index_scale`` defaults to
    DI^-0.5) plus an optional causal window; queries are the last Tq of Tk positions. The
    top-k is not differentiable, so no gradient reaches q_idx / k_idx / w_idx.
    """
    with torch.no_grad():
        idx, valid = dsa_topk(q_idx, k_idx, w_idx, topk=topk, window=window, scale=index_scale, chunk=chunk)
    return sparse_attention(q, k, v, idx, valid, scale=scale, chunk=chunk)


def dsa_indexer_loss(q: Tensor, k: Tensor, q_idx: Tensor, k_idx: Tensor, w_idx: Tensor | None,
                     idx: Tensor, valid: Tensor, *, index_scale: float | None = None,
                     chunk: int = CHUNK) -> Tensor:
    """DeepSeek-V3.2's indexer loss over each query's kept keys idx, valid (B, Tq, K).

    Mean over queries of KL(p || softmax(I)): p, the head-mean of the main attention over
    the kept keys, is a target (no gradient); I, the index scores, carries the gradient
    to q_idx, k_idx, w_idx. Computed per query block on the gathered keys only.
    """
    b, t_q, hq, d = q.shape
    h = k.shape[2]
    total = q.new_zeros(())
    for s, e in _blocks(t_q, chunk):
        i, ok = idx[:, s:e], valid[:, s:e]  # (B, n, K)
        with torch.no_grad():
            kg = _gather_time(k, i[..., None])  # (B, n, K, H, D)
            logits = torch.einsum("bnhgd,bnlhd->bnhgl", q[:, s:e].view(b, e - s, h, hq // h, d), kg) * d ** -0.5
            p = logits.masked_fill(~ok[:, :, None, None], float("-inf")).softmax(-1).mean((2, 3))  # (B, n, K)
        k_sel = _gather_time(k_idx[:, :, None], i[..., None])[:, :, :, 0]  # (B, n, K, DI)
        scale = q_idx.shape[-1] ** -0.5 if index_scale is None else index_scale
        scores = F.relu(torch.einsum("bnjd,bnld->bnjl", q_idx[:, s:e], k_sel) * scale)  # (B, n, HI, K)
        index = scores.sum(2) if w_idx is None else torch.einsum("bnjl,bnj->bnl", scores, w_idx[:, s:e])
        log_q = index.masked_fill(~ok, float("-inf")).log_softmax(-1).masked_fill(~ok, 0.0)
        total = total + (p * (p.clamp_min(1e-30).log() - log_q)).sum()  # p = 0 off the kept keys
    return total / (b * t_q)


def _nsa_block_select(probs: Tensor, pos: Tensor, visible: Tensor, n_sel: Tensor | int, block_size: int,
                      end: int) -> Tensor:
    """Top blocks (B, n, H, S) of one query block at positions pos (n,) < end, -1 padded:
    probs (B, n, H, C) over the visible compressed blocks, the first, previous and current
    blocks forced in."""
    n_cols = (end - 1) // block_size + 1  # blocks up to the last query's own
    probs = F.pad(probs, (0, n_cols - probs.shape[-1]))
    visible = F.pad(visible, (0, n_cols - visible.shape[-1]), value=False)  # (n, C')
    i_blk, i_c = pos[:, None] // block_size, torch.arange(n_cols, device=pos.device)[None, :]
    forced = (i_c == i_blk) | (i_c == 0) | (i_c == i_blk - 1)
    probs = torch.where(forced[:, None], 1.0, probs)
    if torch.is_tensor(n_sel):
        top = topk_latest(probs, int(n_sel.max()) if n_sel.numel() else 0, n_sel)  # (B, n, H, S')
    else:
        top = topk_latest(probs, n_sel)
    ok = (visible | forced)[:, None].expand_as(probs).gather(-1, top.clamp(min=0)) & (top >= 0)
    return torch.where(ok, top, -1)


def _nsa_compressed(q: Tensor, k_cmp: Tensor, v_cmp: Tensor, pos: Tensor, block_size: int,
                    scale: float, end: int) -> tuple[Tensor, Tensor, Tensor]:
    """Compressed branch of one query block at positions pos (n,) < end: output (B, n, HQ, Dv),
    block probabilities averaged over each query group (B, n, H, C) and visibility (n, C)."""
    b, n, hq, d = q.shape
    h, c = k_cmp.shape[2], end // block_size  # complete blocks the last query sees
    visible = (torch.arange(c, device=q.device)[None, :] + 1) * block_size - 1 <= pos[:, None]  # (n, C)
    logits = torch.einsum("bnhgd,bchd->bnhgc", q.view(b, n, h, hq // h, d), k_cmp[:, :c]) * scale
    mask = visible[:, None, None]  # (n, 1, 1, C)
    empty = ~mask.any(-1, keepdim=True)
    p = logits.masked_fill(~(mask | empty), float("-inf")).softmax(-1)
    o = torch.einsum("bnhgc,bchd->bnhgd", p, v_cmp[:, :c]).masked_fill(empty, 0.0)
    return o.flatten(2, 3), p.detach().masked_fill(empty, 0.0).mean(3), visible


def _nsa_selected(q: Tensor, k: Tensor, v: Tensor, block_indices: Tensor, pos: Tensor, block_size: int,
                  scale: float) -> Tensor:
    """Selected branch of one query block: each query over the tokens (<= its position) of
    its head's blocks, block_indices (B, n, H, S), -1 = empty slot; a repeated block counts once."""
    repeat = (block_indices[..., :, None] == block_indices[..., None, :]).tril(-1).any(-1)
    block_indices = block_indices.masked_fill(repeat, -1)
    tokens = (block_indices[..., None] * block_size + torch.arange(block_size, device=q.device)).flatten(-2)
    ok = (tokens >= 0) & (tokens <= pos[:, None, None])  # (B, n, H, S * bs)
    i = tokens.where(ok, 0).transpose(2, 3)  # (B, n, L, H)
    return _attend(q, _gather_time(k, i), _gather_time(v, i), ok.transpose(2, 3), scale)


def nsa_attention(q: Tensor, k: Tensor, v: Tensor, g_cmp: Tensor | None = None,
                  g_slc: Tensor | None = None, g_swa: Tensor | None = None, *,
                  block_counts: int | Tensor = 16, block_size: int = 64, window: int | None = 0,
                  scale: float | None = None, block_indices: Tensor | None = None,
                  k_cmp: Tensor | None = None, v_cmp: Tensor | None = None, chunk: int = CHUNK) -> Tensor:
    """Native sparse attention with fla ``naive_nsa`` semantics, one query block at a time.

    ``o = g_slc * o_slc + g_cmp * o_cmp + g_swa * o_swa`` with gates (B, Tq, HQ) already
    squashed; q (B, Tq, HQ, D) are the last Tq of the Tk keys. Without ``g_cmp`` the
    compressed branch is skipped and ``block_indices`` (B, Tq, H, S) must be given;
    ``window`` of 0 / None skips the sliding branch. ``k_cmp``, ``v_cmp``: the means of
    the complete key blocks when already known (a decoding cache), else pooled from k, v.
    Ties among block scores go to the later block. Per block the memory is
    ``chunk × (Tk / block_size + block_counts × block_size + window)``, linear in T.
    """
    _check_heads(q, k)
    t_q, t_k = q.shape[1], k.shape[1]
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    if g_cmp is None and block_indices is None:
        raise ValueError("nsa_attention needs g_cmp (to select blocks) or block_indices")
    if g_cmp is not None and k_cmp is None:
        done = t_k // block_size * block_size  # a partial last block is never visible
        k_cmp, v_cmp = mean_pool(k[:, :done], block_size), mean_pool(v[:, :done], block_size)
    out = []
    for s, e in _blocks(t_q, chunk):
        hi = t_k - t_q + e  # one past the block's last query
        pos = torch.arange(hi - (e - s), hi, device=q.device)
        o_cmp, selected = None, None if block_indices is None else block_indices[:, s:e]
        if g_cmp is not None:
            o_cmp, probs, visible = _nsa_compressed(q[:, s:e], k_cmp, v_cmp, pos, block_size, scale, hi)
            if selected is None:
                n_sel = block_counts[:, s:e] if torch.is_tensor(block_counts) else block_counts
                selected = _nsa_block_select(probs, pos, visible, n_sel, block_size, hi)
        o = _nsa_selected(q[:, s:e], k, v, selected, pos, block_size, scale)
        if g_slc is not None:
            o = o * g_slc[:, s:e, :, None]
        if o_cmp is not None:
            o = o + o_cmp * g_cmp[:, s:e, :, None]
        if window:
            lo = max(0, hi - (e - s) - window + 1)
            o_swa = attention(q[:, s:e], k[:, lo:hi], v[:, lo:hi], window=window, scale=scale)
            o = o + (o_swa if g_swa is None else o_swa * g_swa[:, s:e, :, None])
        out.append(o)
    return torch.cat(out, 1)
