"""Linear-recurrent token mixers in pure PyTorch: chunked forms and token-by-token references.

Layout follows fla: tokens are ``(B, T, H, K)``, per-head scalars ``(B, T, H)``, states
``(B, H, K, V)`` (Mamba2's SSD keeps its own ``(B, H, P, N)``).

Delta-rule family (fla semantics), per value head and token ``t``::

    S = diag(exp(g_t)) S                     # g_t: scalar (GDN), per key channel (KDA), 0 (delta rule)
    u_t = beta_t * (v_t - S^T k_t)
    S = S + k_t u_t^T
    o_t = scale * S^T q_t

Chunked form: inside a chunk with local cumulative decay ``G_i`` and start state ``S0``,
``(I + A_kk) u = beta*v - beta*exp(G)*k @ S0`` where ``A_kk[i, j] = beta_i sum_d k_id k_jd
exp(G_id - G_jd)`` for ``j < i``. One triangular solve per chunk batch yields ``u = U - W S0``;
only the state hand-off between chunks is sequential. With log decays ``g <= 0`` every ``exp``
is taken of a non-positive number (masked entries become ``-inf``), so strong decays cannot overflow.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from builders.ops.norm import l2_norm

_SUB_CHUNK = 4  # at least; about sqrt(C), which minimises (C/s + s)


# Measured by benchmarks/bench_chunk_size.py (results/bench_chunk_size.md), float32, one thread.
# On CPU, per kind of op: the token recurrence up to T tokens, then one chunk of T tokens up to
# T (no state hand-off at all), then the fewest even chunks of at most the largest chunk.
CPU_RULES = {  # kind: (recurrence up to T, one chunk up to T, largest chunk)
    "delta": (2, 64, 16),  # GDN and the delta rule (scalar decay)
    "kda": (4, 16, 8),  # per-key-channel decay: its Gram matrices cost C/s + s per entry
    "ssd": (1, 48, 16),  # Mamba2's SSD (scalar decay, no solve)
}
MAX_CHUNK = 64  # elsewhere (the torch backend on a GPU): even chunks of at most this


def chunk_size_for(T: int, device_type: str = "cpu", kind: str = "delta") -> int:
    """The chunk size of a ``T``-token sequence when an op is given ``chunk_size=None``; 0: the
    token recurrence. ``kind``: ``"delta"`` (GDN, the delta rule), ``"kda"`` or ``"ssd"``
    (:data:`CPU_RULES`). Split sequences take the fewest chunks of at most the largest size,
    split evenly, so padding is under one token per chunk."""
    largest = MAX_CHUNK
    if device_type == "cpu":
        recurrent_max_t, one_chunk_max_t, largest = CPU_RULES[kind]
        if T <= recurrent_max_t:
            return 0
        if T <= one_chunk_max_t:
            return T
    return -(-T // -(-T // largest))  # ceil(T / the number of chunks)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, N, C, ...) contiguous, zero-padding T up to a multiple of C."""
    pad = -x.shape[1] % chunk_size
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    # one copy here, so that no matmul downstream copies its permuted operands again
    return x.unflatten(1, (-1, chunk_size)).movedim(3, 1).contiguous()


def _from_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, H, N, C, ...) -> (B, T, H, ...)."""
    return x.movedim(1, 3).flatten(1, 2)[:, :T]


def _causal_mask(C: int, device: torch.device) -> torch.Tensor:
    return torch.ones(C, C, dtype=torch.bool, device=device).tril()


def _scalar_decayed_grams(G: torch.Tensor, b: torch.Tensor, *a_list: torch.Tensor) -> list[torch.Tensor]:
    """``(a_i . b_j) exp(G_i - G_j)`` for ``j <= i``, else 0, for each ``a``; G: (..., C, 1)."""
    G = G[..., 0]  # (..., C)
    mask = _causal_mask(G.shape[-1], G.device)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~mask, -torch.inf).exp()  # (..., C, C)
    return [(a @ b.mT) * decay for a in a_list]


def _channel_decayed_grams(G: torch.Tensor, b: torch.Tensor, *a_list: torch.Tensor) -> list[torch.Tensor]:
    """``sum_d a_id b_jd exp(G_id - G_jd)`` for ``j <= i``, else 0, for each ``a``; G: (..., C, K).

    ``exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j)`` with ``r`` the start of i's sub-chunk
    keeps both factors <= 1 for every earlier sub-chunk; pairs inside one sub-chunk are
    decayed explicitly. Memory and work are ``(C/s + s) * K`` per row instead of ``C * K``,
    least at ``s ≈ sqrt(C)`` (measured on CPU: ``s = 4`` at ``C = 16`` is 2× faster than 16).
    """
    C = G.shape[-2]
    s = next(d for d in range(min(max(_SUB_CHUNK, math.isqrt(C)), C), 0, -1) if C % d == 0)
    ns = C // s
    b_s, G_s = b.unflatten(-2, (ns, s)), G.unflatten(-2, (ns, s))  # (..., ns, s, K)
    G_ref = G_s[..., :1, :]  # (..., ns, 1, K)
    start = torch.arange(ns, device=G.device) * s
    earlier = torch.arange(C, device=G.device)[None, :] < start[:, None]  # (ns, C)
    b_out = b[..., None, :, :] * (G_ref - G[..., None, :, :]).masked_fill(~earlier[..., None], -torch.inf).exp()
    a_decay = (G_s - G_ref).exp()  # (..., ns, s, K)
    mask = _causal_mask(s, G.device)[..., None]  # (s, s, 1)
    decay = (G_s[..., :, None, :] - G_s[..., None, :, :]).masked_fill(~mask, -torch.inf).exp()  # (..., ns, s, s, K)
    eye = torch.eye(ns, dtype=G.dtype, device=G.device)[:, None, :, None]  # (ns, 1, ns, 1)
    grams = []
    for a in a_list:
        a_s = a.unflatten(-2, (ns, s))
        off = (a_s * a_decay) @ b_out.mT  # (..., ns, s, C)
        diag = torch.einsum("...ik,...jk,...ijk->...ij", a_s, b_s, decay)  # (..., ns, s, s)
        full = off.unflatten(-1, (ns, s)) + eye * diag[..., :, :, None, :]  # (..., ns, s, ns, s)
        grams.append(full.flatten(-2).flatten(-3, -2))
    return grams


def _decayed_grams(G: torch.Tensor, b: torch.Tensor, *a_list: torch.Tensor) -> list[torch.Tensor]:
    """Causal (diagonal included) decayed Gram matrices ``(..., C, C)`` of each ``a`` against ``b``."""
    if G.shape[-1] == 1:
        return _scalar_decayed_grams(G, b, *a_list)
    return _channel_decayed_grams(G, b, *a_list)


def _chunk_scan(
    A_qk: torch.Tensor,
    q_in: torch.Tensor | None,
    k_out: torch.Tensor | None,
    decay_out: torch.Tensor | None,
    U: torch.Tensor,
    W: torch.Tensor | None,
    S: torch.Tensor | None,
    final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequential state hand-off over chunks; everything else arrives precomputed.

    A_qk (B, H, N, C, C); q_in, W, k_out (B, H, N, C, K); U (B, H, N, C, V);
    decay_out (B, H, N, K|1, 1); S (B, H, K, V). Chunk values are ``u = U - W S``.
    ``S=None`` is a zero start state: its products are skipped, so the first chunk reads no
    ``q_in``/``W``; the state after the last chunk is built only for ``final_state``. With
    one chunk from a zero state and no final state, ``q_in``, ``k_out``, ``decay_out`` and
    ``W`` are never read (None).
    """
    N = U.shape[2]
    if N == 1 and S is None and not final_state:
        return A_qk @ U, None
    outs = []
    # unbind, not indexing: its backward is one stack instead of a zero-filled copy per chunk.
    per_chunk = (itertools.repeat(None) if t is None else t.unbind(2) for t in (A_qk, q_in, k_out, decay_out, U, W))
    for i, (a, q, k, d, u, w) in enumerate(zip(*per_chunk)):
        if S is None:
            outs.append(a @ u)
        else:
            u = u if w is None else u - w @ S  # (B, H, C, V)
            outs.append(q @ S + a @ u)
        if i < N - 1 or final_state:
            S = k.mT @ u if S is None else d * S + k.mT @ u
    return torch.stack(outs, dim=2), S if final_state else None


def _initial_state(initial_state: torch.Tensor | None, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    if initial_state is None:
        return like.new_zeros(shape)
    return initial_state.to(like.dtype)


def _start_state(initial_state: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """The chunked forms' start state in the compute dtype; None (zero) stays None, see _chunk_scan."""
    return None if initial_state is None else initial_state.to(like.dtype)


def _prepare_qk(q, k, HV, use_qk_l2norm):
    """l2-normalise q/k if asked and repeat them for grouped value heads (head h reads h // (HV/H))."""
    if HV % q.shape[2]:
        raise ValueError(f"value heads ({HV}) must be a multiple of q/k heads ({q.shape[2]})")
    if use_qk_l2norm:
        q, k = l2_norm(q), l2_norm(k)
    group = HV // q.shape[2]
    if group == 1:
        return q, k
    return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)


def _chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, chunk_size):
    """Shared chunked delta rule; g: (B, T, HV, 1) scalar or (B, T, HV, K) per-channel log decay."""
    _, T, HV, V = v.shape
    if chunk_size is None:
        chunk_size = chunk_size_for(T, v.device.type, "kda" if g.shape[-1] > 1 else "delta")
    if chunk_size == 0:
        return _recurrent_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm)
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    out_dtype, dtype = v.dtype, _compute_dtype(v)
    q, k = _prepare_qk(q, k, HV, use_qk_l2norm)
    q, k, v, g, beta = (_to_chunks(x.to(dtype), chunk_size) for x in (q, k, v, g, beta))
    b = beta[..., None]  # (B, HV, N, C, 1)
    G = g.cumsum(-2)  # (B, HV, N, C, K|1)
    G_end = G[..., -1:, :]  # (B, HV, N, 1, K|1)
    qk, kk = _decayed_grams(G, k, q, k)  # (B, HV, N, C, C)
    A_kk = b * kk  # its diagonal and upper part are never read: the solve below is unitriangular
    S0 = _start_state(initial_state, v)
    carries = S0 is not None or q.shape[2] > 1  # some chunk starts from a state: W and q_in are read
    keeps = carries or output_final_state  # some chunk hands a state on: k_out and decay_out are read
    # unitriangular=True reads only the strict lower part: this solves (I + A_kk) X = rhs.
    rhs = torch.cat([b * v, b * G.exp() * k], -1) if carries else b * v
    UW = torch.linalg.solve_triangular(A_kk, rhs, upper=False, unitriangular=True)
    U, W = UW.split([V, K], dim=-1) if carries else (UW, None)
    q_in = scale * q * G.exp() if carries else None
    k_out, decay_out = (k * (G_end - G).exp(), G_end.exp().mT) if keeps else (None, None)
    o, S = _chunk_scan(scale * qk, q_in, k_out, decay_out, U, W, S0, output_final_state)
    return _from_chunks(o, T).to(out_dtype), S


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule (fla's ``chunk_gated_delta_rule``), chunked.

    Args:
        q, k: ``(B, T, H, K)``; v: ``(B, T, HV, V)`` with ``HV`` a multiple of ``H``.
        g: ``(B, T, HV)`` log decay (<= 0); beta: ``(B, T, HV)``.
        scale: defaults to ``K ** -0.5``.
        initial_state: ``(B, HV, K, V)``.
        chunk_size: tokens per chunk; ``None``: :func:`chunk_size_for` of T, the device and
            the op; ``0``: the token recurrence.

    Returns:
        ``o (B, T, HV, V)`` in v's dtype and the final ``(B, HV, K, V)`` state (float32 or
        float64) if ``output_final_state`` else ``None``.
    """
    return _chunk_delta(
        q, k, v, g[..., None], beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, chunk_size
    )


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Delta rule (fla's ``chunk_delta_rule``): the gated delta rule with ``g = 0``."""
    g = beta.new_zeros(*beta.shape, 1)
    return _chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, chunk_size)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi delta attention (fla's ``chunk_kda``): the delta rule with a per-key-channel decay.

    g: ``(B, T, HV, K)`` log decay (<= 0); other arguments as ``chunk_gated_delta_rule``.
    """
    return _chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, chunk_size)


def _skip_weight(D: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Mamba2's D, per head (H,) or per channel (H, P), as (H, P|1)."""
    return (D if D.dim() == 2 else D[:, None]).to(dtype)


def chunk_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    chunk_size: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mamba2 SSD scan as fla's ``Mamba2.torch_forward`` computes it, chunked.

    ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t``.

    Args:
        x: ``(B, T, H, P)``; dt: ``(B, T, H)`` after softplus and clamping; A: ``(H,)`` (< 0).
        B, C: ``(B, T, H, N)``, already expanded from groups to heads.
        D: ``(H,)`` or ``(H, P)`` skip weight, or ``None``.
        initial_state: ``(B, H, P, N)``.
        chunk_size: as ``chunk_gated_delta_rule``'s.

    Returns:
        ``y (B, T, H, P)`` in x's dtype and the final ``(B, H, P, N)`` state if asked.
    """
    T = x.shape[1]
    chunk_size = chunk_size_for(T, x.device.type, "ssd") if chunk_size is None else chunk_size
    if chunk_size == 0:
        return recurrent_ssd_ref(x, dt, A, B, C, D, initial_state, output_final_state)
    dtype = _compute_dtype(x)
    g = dt.to(dtype) * A.to(dtype)  # (B, T, H)
    v = x.to(dtype) * dt.to(dtype)[..., None]
    q, k, v, g = (_to_chunks(t, chunk_size) for t in (C.to(dtype), B.to(dtype), v, g[..., None]))
    G = g.cumsum(-2)  # (B, H, N, C, 1)
    G_end = G[..., -1:, :]
    (A_qk,) = _scalar_decayed_grams(G, k, q)
    S0 = _start_state(initial_state, v)
    S0 = None if S0 is None else S0.mT  # (B, H, N_state, P)
    carries = S0 is not None or q.shape[2] > 1
    keeps = carries or output_final_state
    y, S = _chunk_scan(A_qk, q * G.exp() if carries else None, k * (G_end - G).exp() if keeps else None,
                       G_end.exp().mT if keeps else None, v, None, S0, output_final_state)
    y = _from_chunks(y, T)
    if D is not None:
        y = y + x.to(dtype) * _skip_weight(D, dtype)
    return y.to(x.dtype), S.mT if output_final_state else None


def _recurrent_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm):
    """Token-by-token delta rule; g: (B, T, HV, 1) or (B, T, HV, K)."""
    B, T, HV, V = v.shape
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    out_dtype, dtype = v.dtype, _compute_dtype(v)
    q, k = _prepare_qk(q, k, HV, use_qk_l2norm)
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    S = _initial_state(initial_state, (B, HV, K, V), v)
    outs = []
    for t in range(T):
        S = S * g[:, t, :, :, None].exp()
        u = beta[:, t, :, None] * (v[:, t] - (k[:, t, :, :, None] * S).sum(-2))  # (B, HV, V)
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    return torch.stack(outs, dim=1).to(out_dtype), S if output_final_state else None


def recurrent_gated_delta_rule_ref(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False
):
    """Token-by-token reference for ``chunk_gated_delta_rule`` (same arguments, no chunk_size)."""
    g = g[..., None]
    return _recurrent_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)


def recurrent_delta_rule_ref(
    q, k, v, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False
):
    """Token-by-token reference for ``chunk_delta_rule``."""
    g = beta.new_zeros(*beta.shape, 1)
    return _recurrent_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)


def recurrent_kda_ref(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False
):
    """Token-by-token reference for ``chunk_kda``."""
    return _recurrent_delta(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)


def recurrent_ssd_ref(x, dt, A, B, C, D=None, initial_state=None, output_final_state=False):
    """Token-by-token reference for ``chunk_ssd``; state (B, H, P, N)."""
    batch, T, H, P = x.shape
    in_dtype, dtype = x.dtype, _compute_dtype(x)
    x, dt, A, B, C = (t.to(dtype) for t in (x, dt, A, B, C))
    h = _initial_state(initial_state, (batch, H, P, B.shape[-1]), x)
    ys = []
    for t in range(T):
        dA = (dt[:, t] * A).exp()[..., None, None]  # (B, H, 1, 1)
        h = dA * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        ys.append((h * C[:, t, :, None, :]).sum(-1))  # (B, H, P)
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + x * _skip_weight(D, dtype)
    return y.to(in_dtype), h if output_final_state else None
