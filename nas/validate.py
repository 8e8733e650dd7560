"""Checks on a canonical spec that field types alone cannot express.

Each check returns :class:`Problem` s (path + what would be valid); ``validate`` runs
them all so a user sees every problem at once.
"""
from __future__ import annotations

import math

from .errors import Problem
from .placement import option_weights
from .plan import application_cap_problem, max_loops
from .spec import (
    WEIGHT_TOLERANCE, ArchSpec, AttnSpec, DeltaNetSpec, DSASpec, GDNSpec, KDASpec, LoopRegion,
    Mamba2Spec, MoESpec, NSASpec, SwitchSpec, sub_mixers,
)


def _divides(path: str, a: int, a_name: str, b: int, b_name: str) -> list[Problem]:
    if b % a == 0:
        return []
    return [Problem(path, f"{b_name}={b} is not divisible by {a_name}={a}; "
                          f"choose {a_name} dividing {b}")]


def _product(n: int, factor: float) -> float:
    try:
        return n * factor
    except OverflowError:  # an int beyond float range
        return math.inf


def _is_int(path: str, x: float, what: str) -> list[Problem]:
    if not math.isfinite(x):
        return [Problem(path, f"{what} is too large; adjust the sizes")]
    if abs(x - round(x)) < 1e-9:
        return []
    return [Problem(path, f"{what} = {x:g} is not an integer; adjust the sizes")]


def mixer_problems(m, width: int, path: str) -> list[Problem]:
    """Size consistency of one mixer."""
    if (sub := sub_mixers(m)) is not None:
        field, children = sub
        return [p for i, b in enumerate(children) for p in mixer_problems(b, width, f"{path}.{field}[{i}]")]
    out: list[Problem] = []
    if isinstance(m, (GDNSpec, KDASpec)):
        out += _is_int(f"{path}.expand_v", _product(m.head_dim, m.expand_v), "head_dim * expand_v")
        if m.num_v_heads is not None:
            out += _divides(f"{path}.num_v_heads", m.num_heads, "num_heads", m.num_v_heads, "num_v_heads")
    if isinstance(m, DeltaNetSpec):
        for name, e in (("expand_k", m.expand_k), ("expand_v", m.expand_v)):
            dim = _product(width, e)
            out += _is_int(f"{path}.{name}", dim, f"width * {name}")
            if not out:
                out += _divides(f"{path}.num_heads", m.num_heads, "num_heads", int(round(dim)),
                                f"width * {name}")
    if isinstance(m, Mamba2Spec):
        inner = m.expand * width
        if m.num_heads * m.head_dim != inner:
            out.append(Problem(f"{path}.num_heads", f"num_heads * head_dim = "
                               f"{m.num_heads * m.head_dim} must equal expand * width = {inner}; "
                               "leave num_heads unset to derive it"))
        out += _divides(f"{path}.n_groups", m.n_groups, "n_groups", m.num_heads, "num_heads")
    if isinstance(m, (AttnSpec, DSASpec, NSASpec)) and m.num_kv_heads is not None:
        out += _divides(f"{path}.num_kv_heads", m.num_kv_heads, "num_kv_heads", m.num_heads, "num_heads")
    if isinstance(m, (AttnSpec, DSASpec, NSASpec)) and m.rope_theta is not None and m.head_dim % 2:
        out.append(Problem(f"{path}.head_dim", f"head_dim={m.head_dim} must be even for rope "
                           "(or set rope_theta: null)"))
    if isinstance(m, AttnSpec):
        out += _attn_option_problems(m, path)
    return out


def _attn_option_problems(m: AttnSpec, path: str) -> list[Problem]:
    """Partial rotary and q/k-norm span: fields that only mean something with another."""
    out = []
    if m.rope_dim is not None:
        if m.rope_theta is None:
            out.append(Problem(f"{path}.rope_dim", "partial rotary needs rope; set rope_theta or remove rope_dim"))
        elif m.rope_dim % 2 or m.rope_dim > m.head_dim:
            out.append(Problem(f"{path}.rope_dim", f"rope_dim={m.rope_dim} must be even and at most "
                               f"head_dim={m.head_dim}"))
    if m.qk_norm_over != "head" and m.qk_norm is False:
        out.append(Problem(f"{path}.qk_norm_over", "applies only with qk_norm; set qk_norm or remove it"))
    return out


def switch_problems(arch: ArchSpec, m: SwitchSpec, path: str, expected: tuple[float, ...] | None
                    ) -> list[Problem]:
    """A switch runs option i with probability ``weights[i]`` in the executor's sampler and
    in the cost model alike; random placement (ratio, sampling) must draw exactly those
    (``expected``: :func:`nas.placement.option_weights`)."""
    rp = arch.random_placement
    if rp is None:
        return [Problem(path, "a switch mixer needs random_placement (written by hybrid "
                              "placement: random)")]
    if len(rp.ratio) != len(m.options):
        return [Problem(f"{path}.options", f"{len(m.options)} options but random_placement.ratio "
                        f"names {len(rp.ratio)} mixers; give one ratio entry per option, in "
                        "option order")]
    if m.weights is None:
        return [Problem(f"{path}.weights", "missing: the probability of each option; lower the "
                        "spec (nas.lower) to fill it from random_placement")]
    if any(abs(a - b) > WEIGHT_TOLERANCE for a, b in zip(m.weights, expected)):
        fmt = lambda w: "(" + ", ".join(f"{x:.6g}" for x in w) + ")"
        return [Problem(f"{path}.weights", f"{fmt(m.weights)} but random_placement (ratio "
                        f"{':'.join(map(str, rp.ratio.values()))}, sampling {rp.sampling}, "
                        f"{arch.L} layers) runs the options with probabilities {fmt(expected)}; "
                        "write those or leave weights out so lowering fills them")]
    return []


def region_problems(arch: ArchSpec, r: LoopRegion, path: str, moe_before: list[int] | None = None
                    ) -> list[Problem]:
    """``moe_before[f]``: MoE FFNs among flat sublayers 0..f-1 (prefix sums, so the
    routing-replay check is O(1) per region)."""
    L, out = arch.L, []
    for end in ("start", "end"):
        if getattr(r, end).layer >= L:
            out.append(Problem(f"{path}.{end}.layer", f"layer {getattr(r, end).layer} does not "
                               f"exist; the model has layers 0..{L - 1}"))
    if out:
        return out
    if r.start.flat > r.end.flat:
        out.append(Problem(path, f"start {r.start} comes after end {r.end}; a loop covers "
                           "sublayers in execution order"))
    for j, o in enumerate(r.schedule):
        out += _override_problems(arch, r, o, f"{path}.schedule[{j}]")
    if r.truncate is not None and r.truncate >= max(r.T, max_loops(arch)):
        out.append(Problem(f"{path}.truncate", f"truncate={r.truncate} keeps the gradient of every "
                           f"iteration (the loop runs at most {max(r.T, max_loops(arch))}); use "
                           "fewer, or remove truncate"))
    moe_before = moe_before if moe_before is not None else _moe_prefix(arch)
    if r.routing_replay and moe_before[r.end.flat + 1] == moe_before[r.start.flat]:
        out.append(Problem(f"{path}.routing_replay", "the loop contains no MoE FFN to replay; "
                           "set routing_replay: false"))
    return out


def _moe_prefix(arch: ArchSpec) -> list[int]:
    out = [0]
    for layer in arch.layers:
        out += [out[-1], out[-1] + isinstance(layer.ffn, MoESpec)]
    return out


def _override_problems(arch: ArchSpec, r: LoopRegion, o, path: str) -> list[Problem]:
    out = []
    if o.iteration >= r.T:
        out.append(Problem(f"{path}.iteration", f"iteration {o.iteration} is outside the loop's "
                           f"T={r.T} iterations (0..{r.T - 1})"))
    if not (o.layer < arch.L and r.start.flat <= 2 * o.layer <= r.end.flat):
        return out + [Problem(f"{path}.layer", f"layers[{o.layer}].mixer is not inside this loop "
                              f"({r.start} .. {r.end})")]
    mixer = arch.layers[o.layer].mixer
    if o.window is not None and not isinstance(mixer, (AttnSpec, NSASpec)):
        out.append(Problem(f"{path}.window", f"layers[{o.layer}].mixer is '{mixer.kind}', which "
                           "has no window; windows apply to attn and nsa"))
    if o.topk is not None and not isinstance(mixer, DSASpec):
        out.append(Problem(f"{path}.topk", f"layers[{o.layer}].mixer is '{mixer.kind}'; topk "
                           "applies to dsa"))
    return out


def overlap_problems(arch: ArchSpec) -> list[Problem]:
    """Regions must be disjoint or strictly nested. Sorted by (start, −end), each region
    meets the regions still open around it on a stack; it must end inside the innermost
    one. O(R log R) in the number of regions."""
    out, stack = [], []  # stack: indices of open regions, innermost last
    for j in sorted(range(len(arch.loops)), key=lambda j: (arch.loops[j].start.flat,
                                                           -arch.loops[j].end.flat, j)):
        r = arch.loops[j]
        while stack and arch.loops[stack[-1]].end.flat < r.start.flat:
            stack.pop()
        if stack:
            i = stack[-1]
            a = arch.loops[i]
            if r.end.flat > a.end.flat or (a.start.flat, a.end.flat) == (r.start.flat, r.end.flat):
                first, second = sorted((i, j))
                o = arch.loops[first]
                out.append(Problem(f"loops[{second}]", f"overlaps loops[{first}] ({o.start} .. "
                                   f"{o.end}) without being nested inside it; loops must be "
                                   "disjoint or strictly nested"))
                continue
        stack.append(j)
    return out


def loop_problems(arch: ArchSpec) -> list[Problem]:
    out, moe_before = [], _moe_prefix(arch)
    for i, r in enumerate(arch.loops):
        out += region_problems(arch, r, f"loops[{i}]", moe_before)
    return out if out else overlap_problems(arch)


def validate(arch: ArchSpec) -> list[Problem]:
    """Every problem with a canonical spec (empty list: valid)."""
    out: list[Problem] = []
    rp = arch.random_placement
    expected = option_weights(rp, arch.L) if rp is not None else None
    for i, layer in enumerate(arch.layers):
        out += mixer_problems(layer.mixer, arch.model.width, f"layers[{i}].mixer")
        if isinstance(layer.mixer, SwitchSpec):
            out += switch_problems(arch, layer.mixer, f"layers[{i}].mixer", expected)
        if isinstance(layer.ffn, MoESpec) and layer.ffn.shared_expert_gate and not layer.ffn.shared_expert_hidden:
            out.append(Problem(f"layers[{i}].ffn.shared_expert_gate", "gates the shared expert and "
                               "there is none; set shared_expert_hidden or remove it"))
    loop_out = loop_problems(arch)
    out += loop_out
    # Well-formed regions (disjoint or nested, inside the model) make the plan a tree in
    # execution order: one residual stream, every sublayer run Π T times, one kind per
    # weight. Only its size is left to check, arithmetically (never by unrolling).
    if not loop_out:
        cap = application_cap_problem(arch)
        if cap is not None:
            out.append(Problem("loops", cap))
    if arch.kv_policy == "last_loop" and not arch.loops:
        out.append(Problem("kv_policy", "last_loop shares one KV cache across loop iterations "
                           "and this model has no loop; remove kv_policy or add a loop"))
    if arch.elastic is not None and not arch.loops:
        out.append(Problem("elastic", "elastic depth needs at least one loop; add a loop or "
                           "remove elastic"))
    return out


__all__ = ["validate", "mixer_problems", "switch_problems", "loop_problems", "overlap_problems"]
