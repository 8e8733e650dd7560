"""The cost sheet of a canonical spec: per-op rows summed over the plan's applications,
loop extras, projection compute, unique parameters, training FLOPs and inference memory."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..elastic import expected, phases
from ..metrics import COST_METRICS, DEFAULT_SEQ_LEN
from ..plan import check_loops, max_loops
from ..rules import rules_of
from ..spec import ArchSpec, MoESpec, NoFFNSpec, Spec, SwitchSpec
from .counting import _CACHE, Counts, _key, counts, layer_choices, mixer_settings
from .ops import op_active_params, op_kv_elements, op_params, op_seq_flops, op_state_bytes

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


class OpCost(NamedTuple):
    """One sublayer; FLOPs per token summed over its applications, memory per sequence."""

    layer: int
    op: str
    kind: str
    params: int
    applications: int
    projection_flops: float
    seq_mixing_flops: float
    kv_cache_bytes: int
    state_bytes: int


class ExtraCost(NamedTuple):
    """One loop-extra parameter tensor (named as in the model) and its matmul FLOPs."""

    name: str
    params: int
    flops: float


class ProjectionFlops(NamedTuple):
    """Projection compute per token: Σ applications · C_A, Σ applications · C_F, C_H."""

    mixer: float
    ffn: float
    head: float

    @property
    def total(self) -> float:
        return self.mixer + self.ffn + self.head


class Figures(NamedTuple):
    """Everything that depends on the loop count (``loops=None``: each region's own T)."""

    loops: int | None
    projection: ProjectionFlops
    loop_extra_flops: float
    seq_mixing_flops: float
    kv_cache_bytes: int
    state_bytes: int
    ops: tuple[OpCost, ...]
    extras: tuple[ExtraCost, ...]

    @property
    def forward_flops(self) -> float:
        """Projection + loop extras + sequence mixing, per token of one forward pass."""
        return self.projection.total + self.loop_extra_flops + self.seq_mixing_flops


def _extras(arch: ArchSpec, c: Counts) -> tuple[ExtraCost, ...]:
    """Loop-extra parameters (m = :func:`max_loops`) and their matmul FLOPs per token: each
    rule's :class:`nas.rules.Extra` (derived in its module), its FLOPs times the runs of the
    rule (``updates`` or ``iterations`` of the region). A shared tensor (the shared ρ) is
    listed once, first, under the model's own name."""
    d, m = arch.model.width, max_loops(arch)
    shared: dict[str, ExtraCost] = {}
    own = []
    for j, r in enumerate(arch.loops):
        runs = {"update": c.updates[j], "iteration": c.iterations[j]}
        for rule in rules_of(r):
            for e in rule.extras(r, d, m):
                if e.shared:
                    shared.setdefault(e.name, ExtraCost(e.name, e.size, 0.0))
                    continue
                own.append(ExtraCost(f"loops.{j}.{e.name}", e.size, e.flops * runs[e.runs]))
    return (*shared.values(), *own)


class _Static(NamedTuple):
    params: int
    active: int


class _Profile(NamedTuple):
    params: int
    active: int
    seq: float
    kv: int


def _static(op: Spec, d: int) -> _Static:
    """Parameters and active parameters of one op, cached."""
    key = (_key(op), d)
    s = _CACHE.get(key)
    if s is None:
        if len(_CACHE) >= 1 << 16:
            _CACHE.clear()
        if isinstance(op, SwitchSpec):  # priced per option, see layer_choices
            s = _CACHE[key] = _Static(op_params(op, d), 0)
        else:
            s = _CACHE[key] = _Static(op_params(op, d), op_active_params(op, d))
    return s


def _profile(op: Spec, d: int, n: int) -> _Profile:
    """:func:`_static` plus the context-dependent sequence FLOPs and KV elements, cached."""
    key = (_key(op), d, n)
    p = _CACHE.get(key)
    if p is None:
        if len(_CACHE) >= 1 << 16:
            _CACHE.clear()
        p = _CACHE[key] = _Profile(*_static(op, d), op_seq_flops(op, d, n), op_kv_elements(op, d, n))
    return p


def _scheduled(arch: ArchSpec) -> frozenset[int]:
    return frozenset(o.layer for r in arch.loops for o in r.schedule)


def _layer_profiles(arch: ArchSpec, n: int) -> list[tuple[_Profile | None, _Profile]]:
    """(mixer, ffn) profiles per layer; None where the mixer is priced per application
    setting (a loop-level schedule or a switch), see :func:`_general_mixer_row`."""
    d, scheduled = arch.model.width, _scheduled(arch)
    return [(None if i in scheduled or isinstance(l.mixer, SwitchSpec) else _profile(l.mixer, d, n),
             _profile(l.ffn, d, n)) for i, l in enumerate(arch.layers)]


def _general_mixer_row(arch: ArchSpec, i: int, c: Counts, n: int, nbytes: int) -> OpCost:
    """A mixer whose applications differ (schedule overrides) or that is a switch.

    KV: ``per_loop`` keeps a cache per application, ``last_loop`` one per layer sized for
    the widest window it runs with; recurrent state is per application (each application
    reads its own input sequence, as ELR keeps per-loop state)."""
    d, mixer = arch.model.width, arch.layers[i].mixer
    proj = seq = 0.0
    kv_apps = kv_max = state = 0
    for share, op in mixer_settings(arch, i, c):
        profiles = [(w, _profile(ch, d, n)) for w, ch in layer_choices(op)]
        proj += share * sum(w * 2 * p.active for w, p in profiles)
        seq += share * sum(w * p.seq for w, p in profiles)
        kv = max(p.kv for _, p in profiles)
        kv_apps, kv_max = kv_apps + share * kv, max(kv_max, kv)
        state += share * max(op_state_bytes(ch, d, nbytes) for _, ch in layer_choices(op))
    kv = kv_max if arch.kv_policy == "last_loop" else kv_apps
    return OpCost(i, "mixer", mixer.kind, _static(mixer, d).params, c.apps[2 * i], proj, seq,
                  kv * nbytes, state)


def _ffn_flops(op: Spec, d: int, c: Counts, layer: int, active: int) -> float:
    """Σ applications · C_F of one FFN, less the router (d × E) in the applications that
    replay a routing instead of routing afresh."""
    f = 2 * layer + 1
    router = d * op.num_experts if isinstance(op, MoESpec) else 0
    return 2.0 * (c.apps[f] * active - (c.apps[f] - c.routed[f]) * router)


def _figures(arch: ArchSpec, loops: int | None, n: int, nbytes: int,
             profiles: list[tuple[_Profile | None, _Profile]]) -> Figures:
    """One pass over the layers at a loop count; same KV/state rules as
    :func:`_general_mixer_row`, with every application of a mixer alike."""
    c, layers = counts(arch, loops), arch.layers
    kv_runs = arch.kv_policy != "last_loop"
    rows: list[OpCost] = []
    mixer = ffn = seq = 0.0
    kv = state = 0
    for i, (mp, fp) in enumerate(profiles):
        apps = c.apps[2 * i]
        if mp is None:
            row = _general_mixer_row(arch, i, c, n, nbytes)
        else:
            row = OpCost(i, "mixer", layers[i].mixer.kind, mp.params, apps, 2.0 * apps * mp.active,
                         apps * mp.seq, mp.kv * (apps if kv_runs else 1) * nbytes,
                         apps * op_state_bytes(layers[i].mixer, arch.model.width, nbytes))
        mixer, seq = mixer + row.projection_flops, seq + row.seq_mixing_flops
        kv, state = kv + row.kv_cache_bytes, state + row.state_bytes
        apps = c.apps[2 * i + 1]
        rows += (row, OpCost(i, "ffn", layers[i].ffn.kind, fp.params, apps,
                             _ffn_flops(layers[i].ffn, arch.model.width, c, i, fp.active), 0.0, 0, 0))
        ffn += rows[-1].projection_flops
    extras = _extras(arch, c)
    return Figures(loops, ProjectionFlops(mixer, ffn, 2.0 * arch.model.vocab_size * arch.model.width),
                   sum(e.flops for e in extras), seq, kv, state, tuple(rows), extras)


def projection_flops(arch: ArchSpec, loops: int | None = None) -> ProjectionFlops:
    """Projection compute per token (MixerLoop §3.3) at a loop count; see the :mod:`nas.cost`
    docstring. Raises ValueError for a loop count the model cannot run
    (:func:`nas.plan.loop_count_problem`)."""
    check_loops(arch, loops)
    d, c, scheduled = arch.model.width, counts(arch, loops), _scheduled(arch)
    mixer = ffn = 0.0
    for i, layer in enumerate(arch.layers):
        if i in scheduled or isinstance(layer.mixer, SwitchSpec):
            for share, op in mixer_settings(arch, i, c):
                mixer += share * sum(w * 2 * _static(ch, d).active for w, ch in layer_choices(op))
        else:
            mixer += 2 * c.apps[2 * i] * _static(layer.mixer, d).active
        ffn += _ffn_flops(layer.ffn, d, c, i, _static(layer.ffn, d).active)
    return ProjectionFlops(mixer, ffn, 2.0 * arch.model.vocab_size * d)


def norm_params(arch: ArchSpec) -> int:
    """``mixer_norm`` and ``ffn_norm`` per layer (no ``ffn_norm`` without an FFN) and the
    final ``norm``: d each, 2d for layernorm (weight + bias)."""
    size = arch.model.width * (2 if arch.model.norm.kind == "layernorm" else 1)
    return size * (1 + sum(2 - isinstance(l.ffn, NoFFNSpec) for l in arch.layers))


def embedding_params(arch: ArchSpec) -> int:
    """``embed`` (V, d), plus ``lm_head`` (V, d) when embeddings are untied."""
    return arch.model.vocab_size * arch.model.width * (1 if arch.model.tie_embeddings else 2)


def unique_params(arch: ArchSpec) -> int:
    """Every parameter of the compiled model, each shared tensor once."""
    d = arch.model.width
    ops = sum(_static(l.mixer, d).params + _static(l.ffn, d).params for l in arch.layers)
    extras = sum(e.params for e in _extras(arch, counts(arch)))
    return embedding_params(arch) + norm_params(arch) + ops + extras


@dataclass(frozen=True)
class CostSheet:
    """The priced spec. ``figures``: at each region's own T; ``per_k``: one per elastic
    evaluation loop count. Memory is per sequence of ``seq_len`` tokens at ``dtype``."""

    name: str
    seq_len: int
    dtype: str
    tokens: int | None
    unique_params: int
    embedding_params: int
    norm_params: int
    figures: Figures
    per_k: tuple[Figures, ...]
    train_flops_per_token: float

    @property
    def non_embedding_params(self) -> int:
        """Unique parameters less ``embed`` and (untied) ``lm_head``."""
        return self.unique_params - self.embedding_params

    @property
    def projection_flops_per_token(self) -> float:
        return self.figures.projection.total

    @property
    def train_flops(self) -> float | None:
        """Training FLOPs of a run of ``tokens`` tokens."""
        return None if self.tokens is None else self.train_flops_per_token * self.tokens

    def at(self, k: int) -> Figures:
        """The figures of elastic evaluation loop count ``k``."""
        for f in self.per_k:
            if f.loops == k:
                return f
        raise KeyError(f"no figures for k={k}; evaluated loop counts: {[f.loops for f in self.per_k]}")

    def to_dict(self) -> dict:
        out = {"name": self.name, "seq_len": self.seq_len, "dtype": self.dtype,
               "tokens": self.tokens, "unique_params": self.unique_params,
               "non_embedding_params": self.non_embedding_params,
               "embedding_params": self.embedding_params, "norm_params": self.norm_params,
               **_figures_dict(self.figures),
               "train_flops_per_token": _num(self.train_flops_per_token),
               "train_flops": None if self.train_flops is None else _num(self.train_flops)}
        if self.per_k:
            out["per_k"] = {str(f.loops): _figures_dict(f) for f in self.per_k}
        out["ops"] = [{k: _num(v) for k, v in r._asdict().items()} for r in self.figures.ops]
        out["extras"] = [{k: _num(v) for k, v in e._asdict().items()} for e in self.figures.extras]
        return out


def _num(x):
    return int(x) if isinstance(x, float) and x.is_integer() else x


_WHOLE_SHEET = {"unique_params", "non_embedding_params", "train_flops"}  # the same at every k


def sheet_value(sheet: dict, metric: str, k: int | None = None) -> float:
    """Cost metric ``metric`` (:data:`nas.metrics.COST_METRICS`) of a priced spec
    (``CostSheet.to_dict()``) at elastic loop count ``k`` (None: each region's own T).
    KeyError for an unknown metric or k."""
    figures = sheet if k is None or metric in _WHOLE_SHEET else sheet["per_k"][str(k)]
    return float(sum(figures[f] for f in COST_METRICS[metric].fields))


def _figures_dict(f: Figures) -> dict:
    p = f.projection
    return {"projection_flops_per_token": _num(p.total),
            "projection_flops_breakdown": {"mixer": _num(p.mixer), "ffn": _num(p.ffn), "head": _num(p.head)},
            "loop_extra_flops_per_token": _num(f.loop_extra_flops),
            "seq_mixing_flops_per_token": _num(f.seq_mixing_flops),
            "forward_flops_per_token": _num(f.forward_flops),
            "kv_cache_bytes": f.kv_cache_bytes, "state_bytes": f.state_bytes}


def _truncated(arch: ArchSpec, k: int | None) -> ArchSpec:
    """The loop that backpropagation runs through at loop count ``k``: a region with
    ``truncate: n`` as a loop of ``min(n, k)`` iterations, the last ones, so its schedule is
    the last iterations' (iteration ``i`` of the cut loop is ``i + k - n`` of the run)."""
    def cut(r):
        runs = k or r.T
        if not r.truncate:
            return r.model_copy(update={"T": runs})
        n = min(r.truncate, runs)
        first = runs - n
        schedule = tuple(o.model_copy(update={"iteration": o.iteration - first})
                         for o in r.schedule if first <= o.iteration < runs)
        return r.model_copy(update={"T": n, "schedule": schedule})

    return arch.model_copy(update={"loops": tuple(cut(r) for r in arch.loops)})


def _train_flops(arch: ArchSpec, fig, grad_fig) -> float:
    """Training FLOPs per token over the run's phases (:func:`nas.elastic.phases`, what the
    trainer runs): each region's T without elastic depth; with it, one loop before
    ``switch_at`` (ELR switches a trained 1-loop model to mixed depth), then the ``train``
    distribution's expectation. Each step is a forward plus a backward of twice the forward
    FLOPs (gradients with respect to activations and to weights) of the part gradient
    flows through: all of it, except the iterations of a truncated region before its last
    ``truncate`` (priced as that region run ``truncate`` times)."""
    return sum(frac * expected(dist, lambda k: _step_flops(fig(k), grad_fig(k))) for frac, dist in phases(arch))


def _step_flops(forward: Figures, grad: Figures) -> float:
    """One step's FLOPs per token: the forward, plus a backward of twice the forward FLOPs
    of ``grad``, the part gradients flow through."""
    return forward.forward_flops + 2 * grad.forward_flops


def figures_at(arch: ArchSpec, loops: int | None = None, seq_len: int = DEFAULT_SEQ_LEN,
               dtype: str = "bf16") -> Figures:
    """The figures of one forward pass with every loop region run ``loops`` times (None:
    each region's T), as ``LoopLM.forward(..., loops=k)`` runs it: any allowed count, not
    only the ``elastic.eval`` ones a :class:`CostSheet` carries."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    check_loops(arch, loops)
    return _figures(arch, loops, seq_len, DTYPE_BYTES[dtype], _layer_profiles(arch, seq_len))._replace(loops=loops)


def train_flops_at(arch: ArchSpec, loops: int | None = None, seq_len: int = DEFAULT_SEQ_LEN) -> float:
    """Training FLOPs per token of one step with every loop region run ``loops`` times (None:
    each region's T), as a fixed-depth step runs it (``loopnas bench``): the forward plus the
    backward of :func:`_train_flops`, a truncated region's backward through its last
    ``truncate`` iterations only. :attr:`CostSheet.train_flops_per_token` is its expectation
    over the run's loop-count phases."""
    check_loops(arch, loops)
    nbytes, profiles = DTYPE_BYTES["fp32"], _layer_profiles(arch, seq_len)  # bytes do not enter FLOPs
    forward = _figures(arch, loops, seq_len, nbytes, profiles)
    if not any(r.truncate for r in arch.loops):
        return _step_flops(forward, forward)
    return _step_flops(forward, _figures(_truncated(arch, loops), None, seq_len, nbytes, profiles))


def cost(arch: ArchSpec, seq_len: int = DEFAULT_SEQ_LEN, dtype: str = "bf16",
         tokens: int | None = None) -> CostSheet:
    """Price a canonical spec. Training FLOPs per token are 3 × forward (the backward pass
    costs twice the forward: gradients with respect to activations and to weights), less
    the backward of truncated iterations (:func:`_train_flops`)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    nbytes = DTYPE_BYTES[dtype]
    profiles = _layer_profiles(arch, seq_len)
    by_t: dict[tuple[int, ...], Figures] = {}

    def fig(k: int | None) -> Figures:
        ts = tuple(r.T if k is None else k for r in arch.loops)
        if ts not in by_t:
            by_t[ts] = _figures(arch, k, seq_len, nbytes, profiles)
        return by_t[ts]._replace(loops=k)

    def grad_fig(k: int | None) -> Figures:
        if not any(r.truncate for r in arch.loops):
            return fig(k)
        return _figures(_truncated(arch, k), None, seq_len, nbytes, profiles)

    main = fig(None)
    per_k = tuple(fig(k) for k in arch.elastic.eval) if arch.elastic is not None else ()
    params = (embedding_params(arch) + norm_params(arch) + sum(r.params for r in main.ops)
              + sum(e.params for e in main.extras))
    return CostSheet(arch.name, seq_len, dtype, tokens, params, embedding_params(arch),
                     norm_params(arch), main, per_k, _train_flops(arch, fig, grad_fig))
