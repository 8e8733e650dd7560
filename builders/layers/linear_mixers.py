"""Linear-recurrent token mixers as nn.Modules: a pure-PyTorch twin of each fla layer, and fla's own.

Each ``*Torch`` class takes fla's constructor keywords (the subset loopnas uses, with fla's
defaults), registers parameters with fla's names, shapes, order and initialisation (the same
seed gives the same tensors), and computes fla's forward without mask or varlen. ``forward(x: (B, T, D)) -> (B, T, D)``.

Incremental decoding follows :mod:`builders.cache`: ``forward(x, cache=dict, commit=True)``
continues the sequence the dict has seen. Its state is ``state.recurrent``, the matrix state
per value head in the float32 (or float64) the chunked forward carries between chunks, and
``state.conv_*``, each short conv's last ``W`` inputs ``(B, C, W)``, the layout and size of
fla's ``conv_state``. A call with several tokens (prefill, chunked prefill) runs the chunked
form from the cached state; a single token runs the recurrent step.

``make_fla(kind, **kw)`` builds fla's layer, subclassed so ``forward`` returns the tensor;
its ``state_dict`` is interchangeable with the torch twin's.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from builders import fast
from builders.cache import advance
from builders.layers.fla_runtime import install_interpreter_shims, require
from builders.ops.conv import causal_conv1d
from builders.ops.linear import (
    chunk_delta_rule, chunk_gated_delta_rule, chunk_kda, chunk_ssd, recurrent_delta_rule_ref,
    recurrent_gated_delta_rule_ref, recurrent_kda_ref, recurrent_ssd_ref,
)
from builders.ops.norm import rms_norm, rms_norm_gated


class ShortConv(nn.Conv1d):
    """fla's ``ShortConvolution`` parameters (``weight (D, 1, W)``, ``bias``), causal forward."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False, activation: str | None = "silu"):
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1, groups=hidden_size, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor, cache: dict | None = None, name: str = "", commit: bool = True) -> torch.Tensor:
        if cache is None:  # (B, T, D)
            return causal_conv1d(x, self.weight, self.bias, self.activation)
        return cached_conv1d(x, self.weight, self.bias, self.activation, cache, name, commit)


def cached_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
                  cache: dict, name: str, commit: bool) -> torch.Tensor:
    """The causal conv of the next ``t`` tokens after the inputs kept in ``cache[name]``.

    ``cache[name]`` (B, C, W) holds the last W inputs (zeros before the first token, which
    is the full forward's left padding); W - 1 of them are read, all W are kept, as fla does.
    """
    W = weight.shape[-1]
    tail = cache.get(name)
    if tail is None:
        tail = x.new_zeros(x.shape[0], x.shape[-1], W)
    full = torch.cat([tail.mT.to(x.dtype), x], dim=1)  # (B, W + t, C)
    if commit:
        cache[name] = full[:, -W:].mT.contiguous()
    return causal_conv1d(full, weight, bias, activation)[:, W:]


def _scan(chunk_fn, step_fn, cache: dict | None, commit: bool, *args, **kwargs) -> torch.Tensor:
    """Run a recurrence over the whole sequence (no cache) or from ``cache["state.recurrent"]``:
    the chunked form for several tokens, the recurrent step for one."""
    if cache is None:
        return chunk_fn(*args, **kwargs)[0]
    fn = step_fn if args[0].shape[1] == 1 else chunk_fn
    o, state = fn(*args, initial_state=cache.get("state.recurrent"), output_final_state=True, **kwargs)
    if commit:
        cache["state.recurrent"] = state
    advance(cache, args[0].shape[1], commit)
    return o


class RMSNorm(nn.Module):
    """fla's ``RMSNorm`` (weight only)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """fla's ``FusedRMSNormGated`` (default) or, with a group size and gate-first, Mamba2's ``RMSNormGated``."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        activation: str = "swish",
        group_size: int | None = None,
        norm_before_gate: bool = True,
    ):
        super().__init__()
        self.eps, self.activation = eps, activation
        self.group_size, self.norm_before_gate = group_size, norm_before_gate
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return rms_norm_gated(x, gate, self.weight, self.eps, self.activation, self.group_size, self.norm_before_gate)


def _inv_softplus_dt(n: int, dt_min: float = 1e-3, dt_max: float = 0.1, dt_init_floor: float = 1e-4) -> torch.Tensor:
    """fla's ``dt_bias`` init: softplus^{-1} of a log-uniform step in [dt_min, dt_max]."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = torch.clamp(dt, min=dt_init_floor)
    return dt + torch.log(-torch.expm1(-dt))


def _no_weight_decay(*params: nn.Parameter) -> None:
    for p in params:
        p._no_weight_decay = True


def _check_value_heads(head_dim: int, expand_v: float, num_heads: int, num_v_heads: int) -> None:
    if not math.isclose(head_dim * expand_v, int(head_dim * expand_v), rel_tol=1e-5):
        raise ValueError(f"head_dim * expand_v = {head_dim * expand_v} is not an integer")
    if num_v_heads % num_heads:
        raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of num_heads={num_heads}")


def _cat_bias(projs: tuple[nn.Linear, ...]) -> torch.Tensor | None:
    """The biases of ``projs`` stacked as one projection's (zeros for those without one)."""
    if all(p.bias is None for p in projs):
        return None
    return torch.cat([p.weight.new_zeros(p.out_features) if p.bias is None else p.bias for p in projs])


class _ConvQKV(nn.Module):
    """q/k/v projections followed by fla's short convolutions (or a plain SiLU without them)."""

    def _init_convs(self, conv_size: int, conv_bias: bool, qk_activation: str | None = "silu") -> None:
        self.q_conv1d = ShortConv(self.key_dim, conv_size, conv_bias, qk_activation)
        self.k_conv1d = ShortConv(self.key_dim, conv_size, conv_bias, qk_activation)
        self.v_conv1d = ShortConv(self.value_dim, conv_size, conv_bias, "silu")

    def _qkv(self, x: torch.Tensor, qk_silu: bool = True, cache: dict | None = None, commit: bool = True,
             extra: tuple[nn.Linear, ...] = ()) -> tuple[torch.Tensor, ...]:
        """(B, T, D) -> q, k (B, T, H, K), v (B, T, HV, V), then the projections ``extra`` of x.

        Every projection of x runs as one matmul and, without a cache, the three short convs
        as one (the same parameters concatenated): on a CPU the small ops' overhead, not
        their FLOPs, is what a proxy step spends."""
        projs = (self.q_proj, self.k_proj, self.v_proj, *extra)
        if fast.enabled():
            y = F.linear(x, torch.cat([p.weight for p in projs]), _cat_bias(projs))
        else:  # builders.fast.reference_paths: one nn.Linear call per projection
            y = torch.cat([p(x) for p in projs], -1)
        qkv_dim = 2 * self.key_dim + self.value_dim
        qkv, rest = y[..., :qkv_dim], y[..., qkv_dim:].split([p.out_features for p in extra], -1)
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d) if self.use_short_conv else ()
        fused = bool(convs) and cache is None and len({c.activation for c in convs}) == 1 and fast.enabled()
        if fused:
            bias = torch.cat([c.bias for c in convs]) if self.conv_bias else None
            qkv = causal_conv1d(qkv, torch.cat([c.weight for c in convs]), bias, convs[0].activation)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], -1)
        if convs and not fused:  # one conv per stream, each with its cache entry
            q = self.q_conv1d(q, cache, "state.conv_q", commit)
            k = self.k_conv1d(k, cache, "state.conv_k", commit)
            v = self.v_conv1d(v, cache, "state.conv_v", commit)
        elif not convs:
            q, k, v = (F.silu(q), F.silu(k), F.silu(v)) if qk_silu else (q, k, F.silu(v))
        q, k = q.unflatten(-1, (-1, self.head_k_dim)), k.unflatten(-1, (-1, self.head_k_dim))
        return (q, k, v.unflatten(-1, (-1, self.head_v_dim)), *rest)

    def _out(self, o: torch.Tensor, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """Per-head output norm (gated by ``gate``, g_proj(x) when not given, when present),
        then o_proj: (B, T, HV, V) -> (B, T, D)."""
        if isinstance(self.o_norm, GatedRMSNorm):
            gate = self.g_proj(x) if gate is None else gate
            o = self.o_norm(o, gate.unflatten(-1, (-1, self.head_v_dim)))
        else:
            o = self.o_norm(o)
        return self.o_proj(o.flatten(-2))


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Gates are computed in float32 at least, as fla's kernels do."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _beta(raw: torch.Tensor, allow_neg_eigval: bool) -> torch.Tensor:
    """sigmoid, or 2 * sigmoid so the transition ``I - beta k k^T`` may have negative eigenvalues."""
    return raw.sigmoid() * (2.0 if allow_neg_eigval else 1.0)


class GatedDeltaNetTorch(_ConvQKV):
    """fla's ``GatedDeltaNet``: ``g = -exp(A_log) * softplus(a_proj(x) + dt_bias)``, beta = sigmoid(b_proj(x))."""

    def __init__(
        self,
        hidden_size: int = 2048,
        expand_v: float = 2,
        head_dim: int = 256,
        num_heads: int = 6,
        num_v_heads: int | None = None,
        mode: str = "chunk",
        use_gate: bool = True,
        use_short_conv: bool = True,
        allow_neg_eigval: bool = False,
        conv_size: int = 4,
        conv_bias: bool = False,
        layer_idx: int | None = None,
        norm_eps: float = 1e-5,
        output_gate_activation: str = "swish",
    ):
        super().__init__()
        self.mode, self.layer_idx = mode, layer_idx
        self.hidden_size, self.expand_v, self.allow_neg_eigval = hidden_size, expand_v, allow_neg_eigval
        self.use_gate, self.use_short_conv = use_gate, use_short_conv
        self.conv_size, self.conv_bias = conv_size, conv_bias
        self.num_heads, self.num_v_heads = num_heads, num_v_heads or num_heads
        _check_value_heads(head_dim, expand_v, self.num_heads, self.num_v_heads)
        self.head_dim = self.head_k_dim = head_dim
        self.head_v_dim = int(head_dim * expand_v)
        self.key_dim, self.value_dim = num_heads * head_dim, self.num_v_heads * self.head_v_dim

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.a_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(self.num_v_heads, dtype=torch.float32).uniform_(0, 16)))
        self.dt_bias = nn.Parameter(_inv_softplus_dt(self.num_v_heads))
        _no_weight_decay(self.A_log, self.dt_bias)
        if use_short_conv:
            self._init_convs(conv_size, conv_bias)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
            self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps, activation=output_gate_activation)
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps, dtype=torch.float32)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None, commit: bool = True) -> torch.Tensor:  # (B, T, D)
        gate = (self.g_proj,) if self.use_gate else ()
        q, k, v, a, b, *gate = self._qkv(x, cache=cache, commit=commit, extra=(self.a_proj, self.b_proj, *gate))
        beta = _beta(b, self.allow_neg_eigval)  # (B, T, HV)
        g = -self.A_log.exp() * F.softplus(_upcast(a) + self.dt_bias)  # (B, T, HV)
        o = _scan(chunk_gated_delta_rule, recurrent_gated_delta_rule_ref, cache, commit, q, k, v, g, beta,
                  use_qk_l2norm_in_kernel=True)
        return self._out(o, x, *gate)


class DeltaNetTorch(_ConvQKV):
    """fla's ``DeltaNet``: the delta rule with sigmoid beta and l2- or sum-normalised q/k."""

    def __init__(
        self,
        mode: str = "chunk",
        d_model: int | None = None,
        hidden_size: int = 1024,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        num_heads: int = 4,
        use_beta: bool = True,
        use_gate: bool = False,
        use_short_conv: bool = True,
        conv_size: int = 4,
        conv_bias: bool = False,
        allow_neg_eigval: bool = False,
        layer_idx: int | None = None,
        qk_activation: str = "silu",
        qk_norm: str = "l2",
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        if qk_activation not in ("silu", "relu", "elu", "identity") or qk_norm not in ("l2", "sum"):
            raise ValueError(f"unsupported qk_activation={qk_activation!r} or qk_norm={qk_norm!r}")
        self.mode, self.layer_idx, self.qk_activation, self.qk_norm = mode, layer_idx, qk_activation, qk_norm
        self.hidden_size = hidden_size = d_model if d_model is not None else hidden_size
        self.expand_k, self.expand_v, self.num_heads = expand_k, expand_v, num_heads
        self.use_gate, self.use_short_conv = use_gate, use_short_conv
        self.conv_size, self.conv_bias = conv_size, conv_bias
        self.use_beta, self.allow_neg_eigval = use_beta, allow_neg_eigval
        self.key_dim, self.value_dim = round(hidden_size * expand_k), round(hidden_size * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"key_dim={self.key_dim} and value_dim={self.value_dim} must divide by {num_heads} heads")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        if use_beta:
            self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        if use_short_conv:
            self._init_convs(conv_size, conv_bias, "silu" if qk_activation == "silu" else None)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
            self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps)
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps, dtype=torch.float32)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _feature_map(self, x: torch.Tensor) -> torch.Tensor:
        if self.qk_activation == "relu":
            x = x.relu()
        elif self.qk_activation == "elu":
            x = torch.where(x >= 0, x + 1, x.clamp_max(0).exp())  # fla's elu_p1, no cancellation
        if self.qk_norm == "sum":
            x = F.normalize(x, p=1, dim=-1, eps=1e-6)
        return x

    def forward(self, x: torch.Tensor, cache: dict | None = None, commit: bool = True) -> torch.Tensor:  # (B, T, D)
        extra = ((self.b_proj,) if self.use_beta else ()) + ((self.g_proj,) if self.use_gate else ())
        q, k, v, *rest = self._qkv(x, qk_silu=self.qk_activation == "silu", cache=cache, commit=commit, extra=extra)
        q, k = self._feature_map(q), self._feature_map(k)
        beta = rest.pop(0).sigmoid() if self.use_beta else q.new_ones(q.shape[:-1])  # (B, T, H)
        beta = beta * 2.0 if self.allow_neg_eigval else beta
        o = _scan(chunk_delta_rule, recurrent_delta_rule_ref, cache, commit, q, k, v, beta,
                  use_qk_l2norm_in_kernel=self.qk_norm == "l2")
        return self._out(o, x, *rest)


class KimiDeltaAttentionTorch(_ConvQKV):
    """fla's ``KimiDeltaAttention``: per-key-channel decay from a low-rank ``f_proj``, sigmoid output gate."""

    def __init__(
        self,
        hidden_size: int = 2048,
        expand_v: float = 1,
        head_dim: int = 128,
        num_heads: int = 16,
        num_v_heads: int | None = None,
        mode: str = "chunk",
        use_short_conv: bool = True,
        allow_neg_eigval: bool = False,
        safe_gate: bool = False,
        lower_bound: float | None = None,
        conv_size: int = 4,
        conv_bias: bool = False,
        layer_idx: int | None = None,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        if safe_gate and lower_bound is None:
            raise ValueError("safe_gate=True needs a lower_bound (fla rejects it at the first forward)")
        self.mode, self.layer_idx = mode, layer_idx
        self.hidden_size, self.expand_v, self.allow_neg_eigval = hidden_size, expand_v, allow_neg_eigval
        self.safe_gate, self.lower_bound = safe_gate, lower_bound
        self.use_short_conv, self.conv_size, self.conv_bias = use_short_conv, conv_size, conv_bias
        self.num_heads, self.num_v_heads = num_heads, num_v_heads or num_heads
        _check_value_heads(head_dim, expand_v, self.num_heads, self.num_v_heads)
        self.head_dim = self.head_k_dim = head_dim
        self.head_v_dim = int(head_dim * expand_v)
        self.key_dim, self.value_dim = num_heads * head_dim, self.num_v_heads * self.head_v_dim
        self.gate_dim = self.num_v_heads * head_dim

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        if use_short_conv:
            self._init_convs(conv_size, conv_bias)
        self.f_proj = nn.Sequential(
            nn.Linear(hidden_size, self.head_v_dim, bias=False),
            nn.Linear(self.head_v_dim, self.gate_dim, bias=False),
        )
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        A = torch.zeros(self.num_v_heads) if safe_gate else torch.log(torch.empty(self.num_v_heads).uniform_(1, 16))
        self.A_log = nn.Parameter(A)
        self.dt_bias = nn.Parameter(_inv_softplus_dt(self.gate_dim))
        _no_weight_decay(self.A_log, self.dt_bias)
        self.g_proj = nn.Sequential(
            nn.Linear(hidden_size, self.head_v_dim, bias=False),
            nn.Linear(self.head_v_dim, self.value_dim, bias=True),
        )
        self.o_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps, activation="sigmoid")
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _decay(self, f: torch.Tensor) -> torch.Tensor:
        """(B, T, HV, K) log decay, fla's ``naive_kda_gate`` or, with a lower bound, ``naive_kda_lowerbound_gate``."""
        f = _upcast(f) + self.dt_bias.view(self.num_v_heads, self.head_k_dim)
        A = self.A_log.exp()[:, None]  # (HV, 1)
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(A * f)
        return -A * F.softplus(f)

    def forward(self, x: torch.Tensor, cache: dict | None = None, commit: bool = True) -> torch.Tensor:  # (B, T, D)
        extra = (self.f_proj[0], self.b_proj, self.g_proj[0])  # the low-rank gates' first halves read x
        q, k, v, f, b, gate = self._qkv(x, cache=cache, commit=commit, extra=extra)
        g = self._decay(self.f_proj[1](f).unflatten(-1, (-1, self.head_k_dim)))
        beta = _beta(b, self.allow_neg_eigval)  # (B, T, HV)
        o = _scan(chunk_kda, recurrent_kda_ref, cache, commit, q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        return self._out(o, x, self.g_proj[1](gate))


class Mamba2Torch(nn.Module):
    """fla's ``Mamba2`` as its ``torch_forward`` prefill path computes it (SSD scan, gated group RMSNorm).

    Like that path, head ``h`` reads B/C group ``h % n_groups`` (fla tiles groups with ``repeat``;
    mamba_ssm's CUDA kernel uses ``h // (num_heads / n_groups)``). The two agree for
    ``n_groups`` in ``{1, num_heads}``.

    ``chunk_size=None`` (the default) lets the scan pick its chunk from T
    (:func:`builders.ops.linear.chunk_size_for`), as a spec's default does; fla's layer defaults to 256.
    """

    def __init__(
        self,
        num_heads: int | None = None,
        head_dim: int = 64,
        hidden_size: int = 2048,
        state_size: int = 128,
        expand: int = 2,
        n_groups: int = 1,
        conv_kernel: int = 4,
        conv_init: float | None = None,
        use_conv_bias: bool = True,
        hidden_act: str = "silu",
        A_init_range: tuple[float, float] = (1, 16),
        D_has_hdim: bool = False,
        rmsnorm: bool = True,
        norm_before_gate: bool = False,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        use_bias: bool = False,
        norm_eps: float = 1e-5,
        chunk_size: int | None = None,
        layer_idx: int | None = None,
        backend: str = "cuda",
    ):
        super().__init__()
        self.hidden_size, self.expand, self.head_dim = hidden_size, expand, head_dim
        self.intermediate_size = int(expand * hidden_size)
        self.num_heads = self._check_heads(num_heads, head_dim, n_groups, hidden_act)
        self.ssm_state_size, self.n_groups, self.conv_kernel_size = state_size, n_groups, conv_kernel
        self.D_has_hdim, self.rmsnorm, self.norm_before_gate = D_has_hdim, rmsnorm, norm_before_gate
        self.dt_limit, self.chunk_size, self.layer_idx, self.backend = dt_limit, chunk_size, layer_idx, backend
        self.conv_dim = self.intermediate_size + 2 * n_groups * state_size

        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, padding=conv_kernel - 1, bias=use_conv_bias
        )
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)
        self.in_proj = nn.Linear(hidden_size, self.intermediate_size + self.conv_dim + self.num_heads, bias=use_bias)
        self.dt_bias = nn.Parameter(_inv_softplus_dt(self.num_heads, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.num_heads, dtype=torch.float32).uniform_(*A_init_range)))
        if rmsnorm:
            group_size = self.intermediate_size // n_groups
            self.norm = GatedRMSNorm(self.intermediate_size, norm_eps, "swish", group_size, norm_before_gate)
        self.D = nn.Parameter(torch.ones(self.intermediate_size if D_has_hdim else self.num_heads))
        _no_weight_decay(self.dt_bias, self.A_log, self.D)
        self.out_proj = nn.Linear(self.intermediate_size, hidden_size, bias=use_bias)

    def _check_heads(self, num_heads: int | None, head_dim: int, n_groups: int, hidden_act: str) -> int:
        if self.intermediate_size % head_dim:
            raise ValueError(f"expand * hidden_size = {self.intermediate_size} must divide by head_dim={head_dim}")
        inferred = self.intermediate_size // head_dim
        if num_heads and num_heads != inferred:
            raise ValueError(f"num_heads * head_dim must equal expand * hidden_size = {self.intermediate_size}")
        if inferred % n_groups:
            raise ValueError(f"num_heads={inferred} must be a multiple of n_groups={n_groups}")
        if hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={hidden_act!r}: only silu/swish is supported")
        return inferred

    def forward(self, x: torch.Tensor, cache: dict | None = None, commit: bool = True) -> torch.Tensor:  # (B, T, D)
        H, G, N = self.num_heads, self.n_groups, self.ssm_state_size
        gate, xBC, dt = self.in_proj(x).split([self.intermediate_size, self.conv_dim, H], dim=-1)
        if cache is None:
            xBC = causal_conv1d(xBC, self.conv1d.weight, self.conv1d.bias, activation="silu")
        else:
            xBC = cached_conv1d(xBC, self.conv1d.weight, self.conv1d.bias, "silu", cache, "state.conv", commit)
        xs, B, C = xBC.split([self.intermediate_size, G * N, G * N], dim=-1)
        B, C = (t.unflatten(-1, (G, N)).repeat(1, 1, H // G, 1) for t in (B, C))  # (B, T, H, N), group h % G
        dt = F.softplus(dt + self.dt_bias).clamp(*self.dt_limit)  # (B, T, H)
        D = self.D.view(H, self.head_dim) if self.D_has_hdim else self.D
        y = _scan(functools.partial(chunk_ssd, chunk_size=self.chunk_size), recurrent_ssd_ref, cache, commit,
                  xs.unflatten(-1, (H, self.head_dim)), dt, -self.A_log.exp(), B, C, D)
        y = y.flatten(-2)  # (B, T, H * P)
        y = self.norm(y, gate) if self.rmsnorm else y * F.silu(gate)
        return self.out_proj(y)


TORCH_LAYERS: dict[str, type[nn.Module]] = {
    "gdn": GatedDeltaNetTorch,
    "deltanet": DeltaNetTorch,
    "kda": KimiDeltaAttentionTorch,
    "mamba2": Mamba2Torch,
}


FLA_DECODE_ERROR = ("incremental decoding runs on backend='torch': build the model with "
                    "backend='torch' (same parameters; the state_dict loads unchanged)")


class _TensorOutput:
    """Mixin for fla layers, which return ``(o, attentions, cache)``; loopnas mixers return ``o``."""

    def forward(self, hidden_states: torch.Tensor, cache: dict | None = None, commit: bool = True,
                **kwargs) -> torch.Tensor:
        if cache is not None:
            raise NotImplementedError(FLA_DECODE_ERROR)
        require(hidden_states)
        return super().forward(hidden_states, **kwargs)[0]


class _Mamba2Output:
    """fla's Mamba2 runs ``torch_forward`` off CUDA (Triton only in its act and gated norm)."""

    def forward(self, hidden_states: torch.Tensor, cache: dict | None = None, commit: bool = True,
                **kwargs) -> torch.Tensor:
        if cache is not None:
            raise NotImplementedError(FLA_DECODE_ERROR)
        return super().forward(hidden_states, **kwargs)[0]


@functools.cache
def fla_layer_class(kind: str) -> type[nn.Module]:
    """fla's layer class for ``kind``, subclassed so that ``forward`` returns a tensor."""
    if kind not in TORCH_LAYERS:
        raise ValueError(f"no linear mixer kind {kind!r}; expected one of {sorted(TORCH_LAYERS)}")
    # imported here, not at module load: fla's import takes seconds and warns when Triton has no GPU.
    install_interpreter_shims()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fla.layers import DeltaNet, GatedDeltaNet, KimiDeltaAttention, Mamba2

    base = {"gdn": GatedDeltaNet, "deltanet": DeltaNet, "kda": KimiDeltaAttention, "mamba2": Mamba2}[kind]
    mixin = _Mamba2Output if kind == "mamba2" else _TensorOutput
    return type(f"Fla{base.__name__}", (mixin, base), {"__module__": __name__})


def make_fla(kind: str, **kwargs) -> nn.Module:
    """fla's own layer, parameters named as the ``*Torch`` twin's; constructible on CPU.

    Its forward runs fla's Triton kernels (CUDA, or the CPU under ``TRITON_INTERPRET=1``;
    elsewhere it raises :class:`FlaUnavailableError`), except Mamba2, which falls back to
    ``torch_forward`` off CUDA when its activation and norm can run there.
    """
    return fla_layer_class(kind)(**kwargs)
