"""Sugar → canonical form: pure functions from spec to spec.

``lower(spec)`` resolves the layer list (``num_layers`` + ``layer``, or ``hybrid``),
applies ``model.defaults`` per op kind, fills derived sizes (attention head dim, Mamba-2
heads, FFN widths), and expands ``loop`` sugar into explicit :class:`LoopRegion` s.
"""
from __future__ import annotations

import typing

from pydantic import TypeAdapter, ValidationError

from .errors import Problem, SpecError, fail, format_path, from_validation_error, suggest
from .placement import option_weights, placement, ratio_counts
from .spec import (
    FFN_KINDS, MAX_APPLICATIONS, MIXER_KINDS, ArchSpec, AttnSpec, DSASpec, FFNSpec, HybridSpec, IterOverride,
    LayerSpec, LoopRegion, LoopSugar, Mamba2Spec, MixerSpec, ModelSpec, MoESpec, NormSpec,
    NSASpec, OpAddr, ParallelSpec, Spec, SwiGLUSpec, SwitchSpec, sub_mixers,
)

_MIXER = TypeAdapter(MixerSpec)
_OPS = {cls.model_fields["kind"].default: cls
        for union in (MixerSpec, FFNSpec) for cls in typing.get_args(typing.get_args(union)[0])}
# mixers that a bare name in a hybrid ratio cannot build: they need sub-mixers
_COMPOSITE = ("parallel", "switch")


def default_ffn_hidden(width: int) -> int:
    """fla ``GatedMLP``'s default: 2/3 · 4 · width, rounded up to a multiple of 256."""
    hidden = width * 8 // 3  # int(width * 4 * 2 / 3), exact for any width
    return 256 * ((hidden + 255) // 256)


def _with_defaults(op: Spec, defaults: dict, path: str) -> Spec:
    """Re-validate ``op`` starting from ``defaults[op.kind]``; explicit fields win.

    Each defaults entry is checked on its own first (:func:`_defaults_problems`), so a
    failure here comes from combining the two, and is reported at the layer."""
    explicit = op.model_dump(exclude_unset=True)
    if (sub := sub_mixers(op)) is not None:
        field, children = sub
        explicit[field] = tuple(_with_defaults(b, defaults, f"{path}.{field}[{i}]")
                                for i, b in enumerate(children))
    base = defaults.get(op.kind, {})
    try:
        return type(op).model_validate({**base, **explicit, "kind": op.kind})
    except ValidationError as exc:
        err = from_validation_error(exc, type(op), (path,))
        raise SpecError([Problem(p.path, f"{p.message} (with model.defaults.{op.kind} applied)")
                         for p in err.problems]) from None


def _sized(op: Spec, width: int, path: str) -> Spec:
    """Fill sizes that default to a function of the width."""
    if (sub := sub_mixers(op)) is not None:
        field, children = sub
        subs = tuple(_sized(b, width, f"{path}.{field}[{i}]") for i, b in enumerate(children))
        return op.model_copy(update={field: subs})
    if isinstance(op, (AttnSpec, DSASpec)) and op.head_dim is None:
        if width % op.num_heads:
            raise fail(f"{path}.num_heads", f"width {width} is not divisible by num_heads "
                       f"{op.num_heads}; pick num_heads dividing {width} or set head_dim")
        return op.model_copy(update={"head_dim": width // op.num_heads})
    if isinstance(op, Mamba2Spec) and op.num_heads is None:
        inner = op.expand * width
        if inner % op.head_dim:
            raise fail(f"{path}.head_dim", f"expand*width = {inner} is not divisible by "
                       f"head_dim {op.head_dim}; pick a head_dim dividing {inner}")
        return op.model_copy(update={"num_heads": inner // op.head_dim})
    if isinstance(op, SwiGLUSpec) and op.hidden_size is None:
        return op.model_copy(update={"hidden_size": default_ffn_hidden(width)})
    if isinstance(op, MoESpec) and op.expert_hidden is None:
        return op.model_copy(update={"expert_hidden": default_ffn_hidden(width)})
    return op


def _defaults_problems(model: ModelSpec) -> list[Problem]:
    """Each ``model.defaults`` entry must name an op kind and hold valid fields of it,
    whether or not a layer of that kind exists."""
    out: list[Problem] = []
    for key, values in model.defaults.items():
        path = format_path(("model", "defaults", key))
        if key not in _OPS:
            kinds = MIXER_KINDS + FFN_KINDS
            out.append(Problem(path, f"unknown op kind '{key}'; {suggest(key, kinds)}"
                                     f"valid kinds: {', '.join(kinds)}"))
        elif values.get("kind", key) != key:
            out.append(Problem(f"{path}.kind", f"defaults for '{key}' cannot set kind "
                                               f"{values['kind']!r}; remove kind"))
        else:
            try:
                _OPS[key].model_validate({**values, "kind": key})
            except ValidationError as exc:
                out += [p for p in from_validation_error(exc, _OPS[key], (path,)).problems
                        if p.message != "field required"]
    return out


def _resolve_layer(layer: LayerSpec, model: ModelSpec, path: str) -> LayerSpec:
    mixer = _sized(_with_defaults(layer.mixer, model.defaults, f"{path}.mixer"), model.width, f"{path}.mixer")
    ffn = _sized(_with_defaults(layer.ffn, model.defaults, f"{path}.ffn"), model.width, f"{path}.ffn")
    if isinstance(mixer, ParallelSpec) and mixer.branch_norm is True:  # the model's norm, written out
        mixer = mixer.model_copy(update={"branch_norm": model.norm})
    return LayerSpec(mixer=mixer, ffn=ffn, norm_placement=layer.norm_placement)


def _hybrid_mixer(name: str, hybrid: HybridSpec, path: str) -> MixerSpec:
    if name in hybrid.mixers:
        return hybrid.mixers[name]
    if name in _COMPOSITE:
        raise fail(path, f"a bare '{name}' has no sub-mixers; define it under hybrid.mixers "
                   "and use that key here")
    if name in MIXER_KINDS:
        return _MIXER.validate_python({"kind": name})
    known = sorted(set(hybrid.mixers) | set(MIXER_KINDS) - set(_COMPOSITE))
    raise fail(path, f"'{name}' is neither a mixer kind nor a key of hybrid.mixers; "
               f"{suggest(name, known)}valid names: {', '.join(known)}")


def _check_explicit_ratio(hybrid: HybridSpec, names: list[str]) -> None:
    """An explicit placement list must agree with ``ratio``, which would else be ignored."""
    have = {n: names.count(n) for n in dict.fromkeys(names)}
    want = {n: c for n, c in ratio_counts(hybrid.ratio, len(names)).items() if c}
    if have != want:
        fmt = lambda d: ", ".join(f"{c} {n}" for n, c in d.items())
        raise fail("hybrid.ratio", f"ratio {':'.join(map(str, hybrid.ratio.values()))} over "
                   f"{len(names)} layers means {fmt(want)}, but the placement list has "
                   f"{fmt(have)}; make the ratio match the list")


def _hybrid_layers(spec: ArchSpec) -> tuple[LayerSpec, ...]:
    hybrid, L = spec.hybrid, spec.num_layers
    if hybrid.sampling != "ratio" and hybrid.placement != "random":
        raise fail("hybrid.sampling", "applies only to placement: random (how each random "
                   "pattern is drawn); remove it or set placement: random")
    if hybrid.sampling_per != "forward" and hybrid.placement != "random":
        raise fail("hybrid.sampling_per", "applies only to placement: random (how often a "
                   "random pattern is drawn); remove it or set placement: random")
    ffn = spec.layer.ffn if spec.layer is not None else SwiGLUSpec()
    where = spec.layer.norm_placement if spec.layer is not None else "pre"
    if hybrid.placement == "random":
        if len(hybrid.ratio) < 2:
            raise fail("hybrid.ratio", "placement 'random' switches between mixers; give at "
                       "least two names in the ratio")
        options = tuple(_hybrid_mixer(n, hybrid, format_path(("hybrid", "ratio", n)))
                        for n in hybrid.ratio)
        return (LayerSpec(mixer=SwitchSpec(options=options), ffn=ffn, norm_placement=where),) * L
    for n in hybrid.ratio:
        _hybrid_mixer(n, hybrid, format_path(("hybrid", "ratio", n)))
    explicit, names = isinstance(hybrid.placement, tuple), placement(hybrid, L)
    layers = tuple(LayerSpec(mixer=_hybrid_mixer(n, hybrid, f"hybrid.placement[{i}]" if explicit
                                                 else format_path(("hybrid", "ratio", n))), ffn=ffn,
                             norm_placement=where)
                   for i, n in enumerate(names))
    if explicit:
        _check_explicit_ratio(hybrid, names)
    return layers


def _raw_layers(spec: ArchSpec) -> tuple[LayerSpec, ...]:
    if spec.layers is not None:
        if spec.num_layers is not None or spec.hybrid is not None or spec.layer is not None:
            raise fail("layers", "give either an explicit layers list or num_layers with "
                       "layer/hybrid, not both")
        return spec.layers
    if spec.num_layers is None:
        raise fail("num_layers", "field required: give num_layers (with layer or hybrid) "
                   "or an explicit layers list")
    if spec.hybrid is not None:
        return _hybrid_layers(spec)
    if spec.layer is None:
        raise fail("layer", "field required with num_layers: the layer template to repeat "
                   "(or use hybrid)")
    return (spec.layer,) * spec.num_layers


def _region(a: OpAddr, b: OpAddr, sugar: LoopSugar, schedule=()) -> LoopRegion:
    return LoopRegion(start=a, end=b, T=sugar.T, update=sugar.update,
                      conditioning=sugar.conditioning, schedule=schedule,
                      routing_replay=sugar.routing_replay,
                      iteration_norm=NormSpec() if sugar.iteration_norm else None,
                      truncate=sugar.truncate)


def _selected(sugar: LoopSugar, layers, path: str) -> list[OpAddr]:
    sel = sugar.select
    if sel is None:
        raise fail(f"{path}.select", "boundary 'selective' needs select: {ops, kinds, layers}")
    lo, hi = sel.layers if sel.layers is not None else (0, len(layers) - 1)
    if not 0 <= lo <= hi < len(layers):
        raise fail(f"{path}.select.layers", f"layer range [{lo}, {hi}] is not a range "
                   f"[first, last] with 0 <= first <= last <= {len(layers) - 1}")
    unknown = [k for k in sel.kinds or () if k not in MIXER_KINDS + FFN_KINDS]
    if unknown:
        kinds = MIXER_KINDS + FFN_KINDS
        raise SpecError([Problem(f"{path}.select.kinds", f"unknown op kind '{k}'; "
                                 f"{suggest(k, kinds)}valid kinds: {', '.join(kinds)}")
                         for k in unknown])
    picked = []
    for i in range(lo, hi + 1):
        for op in ("mixer", "ffn"):
            kind = getattr(layers[i], op).kind
            if op in sel.ops and (sel.kinds is None or kind in sel.kinds):
                picked.append(OpAddr(layer=i, op=op))
    if not picked:
        raise fail(f"{path}.select", "selects no sublayer; check ops, kinds and layers")
    return picked


def _elr_span(sugar: LoopSugar, L: int, path: str) -> tuple[OpAddr, OpAddr]:
    parts = (sugar.prelude, sugar.recurrent, sugar.coda)
    missing = [n for n, v in zip(("prelude", "recurrent", "coda"), parts) if v is None]
    if missing:
        raise SpecError([Problem(f"{path}.{n}", "field required with boundary 'elr': "
                                 "prelude, recurrent and coda are layer counts adding up to "
                                 f"the model's {L} layers") for n in missing])
    if sum(parts) != L:
        raise fail(path, f"prelude + recurrent + coda = {sum(parts)} but the model has "
                   f"{L} layers; make them add up to {L}")
    first = sugar.prelude
    return OpAddr(layer=first, op="mixer"), OpAddr(layer=first + sugar.recurrent - 1, op="ffn")


# schedule sugar: field → (mixer kinds it applies to, IterOverride field, what it is)
_SCHEDULES = {"windows": ((AttnSpec, NSASpec), "window", "window"), "topk": ((DSASpec,), "topk", "top-k")}


def _schedulable(sugar: LoopSugar, field: str, x: OpAddr, layers) -> bool:
    return x.op == "mixer" and isinstance(layers[x.layer].mixer, _SCHEDULES[field][0])


def _no_target(field: str, path: str, mixers) -> SpecError:
    """No mixer for a schedule field; points at the other field when the loop has its kind."""
    other = "topk" if field == "windows" else "windows"
    text = ("no attention mixer with a window (attn, nsa)" if field == "windows"
            else "no dsa mixer with a top-k")
    hint = ""
    if any(isinstance(m, _SCHEDULES[other][0]) for m in mixers):
        hint = ("; DSA is sparse attention and its schedule is topk: [...], one top-k per "
                "iteration" if field == "windows" else "; attn and nsa take windows: [...]")
    return fail(f"{path}.{field}", f"the loop contains {text} to schedule{hint}")


def _schedule(sugar: LoopSugar, a: OpAddr, b: OpAddr, layers, path: str, strict: bool = True
              ) -> tuple[IterOverride, ...]:
    """``windows`` / ``topk`` sugar: one value per iteration for every mixer of the kinds
    it applies to between ``a`` and ``b`` (``strict``: a field with no such mixer there
    is an error; per-op regions check that once for the whole boundary instead)."""
    out: list[IterOverride] = []
    for field, (_, key, what) in _SCHEDULES.items():
        values = getattr(sugar, field)
        if values is None:
            continue
        if len(values) != sugar.T:
            raise fail(f"{path}.{field}", f"{len(values)} {field} for T={sugar.T} "
                       f"iterations; give one {what} per iteration")
        lo = a.layer + (a.op == "ffn")
        targets = [i for i in range(lo, b.layer + 1)
                   if _schedulable(sugar, field, OpAddr(layer=i, op="mixer"), layers)]
        if not targets and strict:
            raise _no_target(field, path, [layers[i].mixer for i in range(lo, b.layer + 1)])
        if len(values) * len(targets) > MAX_APPLICATIONS:
            raise fail(f"{path}.{field}", f"{len(values)} iterations × {len(targets)} layers "
                       f"of schedule exceed the cap of {MAX_APPLICATIONS:,} applications")
        out += [IterOverride(iteration=t, layer=i, **{key: v})
                for t, v in enumerate(values) for i in targets]
    return tuple(out)


# sugar fields that only mean something for one boundary
_ONLY_FOR = {"prelude": "elr", "recurrent": "elr", "coda": "elr", "select": "selective",
             "unit": "selective"}


def _stray_fields(sugar: LoopSugar, path: str) -> list[Problem]:
    """Fields away from their defaults that the boundary would silently ignore."""
    changed = [f for f, info in LoopSugar.model_fields.items() if f != "boundary"
               and getattr(sugar, f) != info.get_default(call_default_factory=True)]
    if sugar.boundary == "none":
        return [Problem(f"{path}.{f}", "boundary 'none' loops nothing; remove this field or "
                        "pick a boundary") for f in changed]
    return [Problem(f"{path}.{f}", f"applies only to boundary '{_ONLY_FOR[f]}', not "
                    f"'{sugar.boundary}'; remove it or set boundary: {_ONLY_FOR[f]}")
            for f in changed if _ONLY_FOR.get(f, sugar.boundary) != sugar.boundary]


def lower_loop(sugar: LoopSugar, layers, path: str = "loop", norm: NormSpec | None = None
               ) -> list[LoopRegion]:
    """The regions of one ``loop`` sugar (``norm``: the model's, for ``iteration_norm``)."""
    regions = _lower_loop(sugar, layers, path)
    return [r.model_copy(update={"iteration_norm": norm}) if r.iteration_norm is not None and norm
            else r for r in regions]


def _lower_loop(sugar: LoopSugar, layers, path: str) -> list[LoopRegion]:
    L = len(layers)
    last = OpAddr(layer=L - 1, op="ffn")
    b = sugar.boundary
    stray = _stray_fields(sugar, path)
    if stray:
        raise SpecError(stray)
    if b == "none":
        return []
    if b in ("block", "elr"):
        a, z = (OpAddr(layer=0, op="mixer"), last) if b == "block" else _elr_span(sugar, L, path)
        return [_region(a, z, sugar, _schedule(sugar, a, z, layers, path))]
    if b in ("mixer", "ffn"):
        addrs = [OpAddr(layer=i, op=b) for i in range(L)]
    else:
        addrs = _selected(sugar, layers, path)
        if sugar.unit == "span":
            a, z = addrs[0], addrs[-1]
            return [_region(a, z, sugar, _schedule(sugar, a, z, layers, path))]
    for field in _SCHEDULES:
        if getattr(sugar, field) is not None and not any(_schedulable(sugar, field, x, layers) for x in addrs):
            raise _no_target(field, path, [layers[x.layer].mixer for x in addrs if x.op == "mixer"])
    return [_region(x, x, sugar, _schedule(sugar, x, x, layers, path, strict=False)) for x in addrs]


def _weighted(layers: tuple[LayerSpec, ...], rp: HybridSpec | None) -> tuple[LayerSpec, ...]:
    """Switch layers with their option weights written out (the probabilities random
    placement runs each option with); weights already written are kept, and validation
    checks them against ``rp``."""
    if rp is None or not any(isinstance(l.mixer, SwitchSpec) and l.mixer.weights is None for l in layers):
        return layers
    w, done = option_weights(rp, len(layers)), {}

    def weighted(l: LayerSpec) -> LayerSpec:
        if not (isinstance(l.mixer, SwitchSpec) and l.mixer.weights is None and len(l.mixer.options) == len(w)):
            return l
        if id(l) not in done:  # repeated layers (a template) are one object: copy it once
            done[id(l)] = l.model_copy(update={"mixer": l.mixer.model_copy(update={"weights": w})})
        return done[id(l)]

    return tuple(weighted(l) for l in layers)


def _loop_ffn(layers: tuple[LayerSpec, ...], ffn: FFNSpec, regions: list[LoopRegion],
              model: ModelSpec, path: str) -> tuple[LayerSpec, ...]:
    """``loop.ffn``: every layer a region of this loop touches takes ``ffn`` (with
    ``model.defaults`` and derived sizes applied), e.g. MoE only in ELR's recurrent block."""
    inside = {i for r in regions for i in range(r.start.layer, r.end.layer + 1)}
    resolved = _sized(_with_defaults(ffn, model.defaults, f"{path}.ffn"), model.width, f"{path}.ffn")
    return tuple(l.model_copy(update={"ffn": resolved}) if i in inside else l for i, l in enumerate(layers))


def lower(spec: ArchSpec) -> ArchSpec:
    """The canonical form of ``spec`` (idempotent), at the sizes written. A ``match``
    block is not lowering: :func:`nas.load.resolve` solves it after validation (lower →
    validate → match), so lowering never calls the budget matcher."""
    problems = _defaults_problems(spec.model)
    if problems:
        raise SpecError(problems)
    raw = _raw_layers(spec)
    resolved: dict[int, LayerSpec] = {}  # a template repeated L times is one object: resolve it once
    for i, l in enumerate(raw):
        if id(l) not in resolved:
            resolved[id(l)] = _resolve_layer(l, spec.model, f"layers[{i}]")
    layers = tuple(resolved[id(l)] for l in raw)
    sugars = spec.loop if isinstance(spec.loop, tuple) else ((spec.loop,) if spec.loop else ())
    regions = list(spec.loops)
    for j, s in enumerate(sugars):
        path = "loop" if isinstance(spec.loop, LoopSugar) else f"loop[{j}]"
        own = lower_loop(s, layers, path, spec.model.norm)
        if s.ffn is not None:
            layers = _loop_ffn(layers, s.ffn, own, spec.model, path)
        regions += own
    rp = spec.hybrid if spec.hybrid and spec.hybrid.placement == "random" else spec.random_placement
    return ArchSpec(
        name=spec.name, description=spec.description,
        model=spec.model.model_copy(update={"defaults": {}}),
        layers=_weighted(layers, rp), loops=tuple(regions), elastic=spec.elastic,
        kv_policy=spec.kv_policy, random_placement=rp,
    )


__all__ = ["lower", "lower_loop", "placement", "ratio_counts", "default_ffn_hidden", "SpecError"]
