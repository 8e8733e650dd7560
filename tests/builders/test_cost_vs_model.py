"""nas.cost against the compiled model: parameter counts of hundreds of random specs on the
meta device, and projection compute against torch's FLOP counter on a CPU forward pass."""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from builders import fast
from builders.model import LoopLM, build_model
from nas.cost import Figures, cost, counts, op_active_params, projection_flops, unique_params
from nas.errors import SpecError
from nas.load import load_arch, loads_arch, resolve, spec_from_dict
from nas.lower import ratio_counts
from nas.spec import (
    ArchSpec, AttnSpec, DeltaNetSpec, DSASpec, GDNSpec, KDASpec, Mamba2Spec, NSASpec,
    ParallelSpec, Spec, SwitchSpec,
)
from spaces import ARCHS, arch_names

TINY = [n for n in arch_names() if n.startswith("tiny_")]
TOKENS = 16  # one sequence of 16 tokens: every projection FLOP count is linear in it


def numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- random whole specs

flag = st.booleans()
rare = st.sampled_from([False, False, False, True])
T_VALUES = st.integers(1, 4)


def _gdn(draw, kind):
    h = draw(st.sampled_from([1, 2, 4]))
    out = dict(kind=kind, num_heads=h, head_dim=draw(st.sampled_from([8, 16, 32])),
               expand_v=draw(st.sampled_from([0.5, 1.0, 2.0])),
               num_v_heads=draw(st.sampled_from([None, h, 2 * h])),
               use_short_conv=draw(flag), conv_size=draw(st.integers(2, 4)), conv_bias=draw(flag),
               allow_neg_eigval=draw(flag))
    if kind == "gdn":
        out["use_gate"] = draw(flag)
    return out


def _deltanet(draw):
    return dict(kind="deltanet", num_heads=draw(st.sampled_from([1, 2, 4])),
                expand_k=draw(st.sampled_from([0.5, 1.0, 2.0])),
                expand_v=draw(st.sampled_from([0.5, 1.0, 2.0])), use_beta=draw(flag),
                use_gate=draw(flag), use_short_conv=draw(flag), conv_size=draw(st.integers(2, 4)),
                conv_bias=draw(flag),
                qk_activation=draw(st.sampled_from(["silu", "relu", "elu", "identity"])),
                qk_norm=draw(st.sampled_from(["l2", "sum"])))


def _mamba2(draw):
    return dict(kind="mamba2", head_dim=draw(st.sampled_from([8, 16])),
                state_size=draw(st.sampled_from([4, 8, 16])), expand=draw(st.sampled_from([1, 2])),
                n_groups=draw(st.sampled_from([1, 1, 2])), conv_kernel=draw(st.integers(2, 4)),
                use_conv_bias=draw(flag), use_bias=draw(flag), D_has_hdim=draw(flag),
                rmsnorm=draw(flag), norm_before_gate=draw(flag))


def _attn_common(draw, kind):
    h = draw(st.sampled_from([1, 2, 4, 8]))
    return dict(kind=kind, num_heads=h, num_kv_heads=draw(st.sampled_from([None, h, max(1, h // 2), 1])),
                head_dim=draw(st.sampled_from([None, None, 8, 16])), qkv_bias=draw(flag),
                qk_norm=draw(flag), output_gate=draw(flag),
                rope_theta=draw(st.sampled_from([10000.0, 10000.0, None])))


def _attn(draw):
    out = {**_attn_common(draw, "attn"), "window": draw(st.sampled_from([None, None, 4, 8])),
           "rope_dim": draw(st.sampled_from([None, None, 4]))}
    if out["qk_norm"]:  # fla's norm, a norm spec (zero-centred, layernorm), per head or over all heads
        out["qk_norm"] = draw(st.sampled_from([True, {"eps": 1e-6}, {"zero_centered": True}, {"kind": "layernorm"}]))
        out["qk_norm_over"] = draw(st.sampled_from(["head", "heads"]))
    return out


def _dsa(draw):
    return {**_attn_common(draw, "dsa"), "index_heads": draw(st.integers(1, 4)),
            "index_head_dim": draw(st.sampled_from([4, 8, 16])), "topk": draw(st.sampled_from([4, 8, 64]))}


def _nsa(draw):
    h = draw(st.sampled_from([2, 4]))
    return dict(kind="nsa", num_heads=h, num_kv_heads=draw(st.sampled_from([1, h])),
                head_dim=draw(st.sampled_from([8, 16])), qkv_bias=draw(flag),
                block_size=draw(st.sampled_from([4, 8])), block_counts=draw(st.sampled_from([1, 2, 4])),
                window=draw(st.sampled_from([4, 8, 16])))


BASE = {"gdn": lambda d: _gdn(d, "gdn"), "kda": lambda d: _gdn(d, "kda"), "deltanet": _deltanet,
        "mamba2": _mamba2, "attn": _attn, "dsa": _dsa, "nsa": _nsa}


@st.composite
def base_mixers(draw):
    return BASE[draw(st.sampled_from(sorted(BASE)))](draw)


@st.composite
def mixers(draw):
    if draw(st.sampled_from([False, False, False, True])):
        return {"kind": "parallel", "combine": draw(st.sampled_from(["mean", "sum", "concat"])),
                "branches": draw(st.lists(base_mixers(), min_size=2, max_size=3)),
                "branch_norm": draw(st.sampled_from([False, True, {"kind": "layernorm"}])),
                "branch_scale": draw(flag)}
    return draw(base_mixers())


@st.composite
def ffns(draw):
    kind = draw(st.sampled_from(["swiglu", "swiglu", "moe", "none"]))
    if kind == "swiglu":
        return {"kind": kind, "hidden_size": draw(st.sampled_from([None, 16, 40, 96]))}
    if kind == "moe":
        e = draw(st.integers(1, 4))
        return {"kind": kind, "num_experts": e, "top_k": draw(st.integers(1, e)),
                "expert_hidden": draw(st.sampled_from([None, 16, 32])),
                "shared_expert_hidden": (shared := draw(st.sampled_from([0, 16]))),
                "shared_expert_gate": bool(shared) and draw(flag)}
    return {"kind": kind}


UPDATES = st.sampled_from([
    {"kind": "plain"}, {"kind": "residual_gate", "shared": True},
    {"kind": "residual_gate", "shared": False}, {"kind": "gated_step"},
    {"kind": "reinject", "mode": "add"}, {"kind": "reinject", "mode": "concat"},
    {"kind": "reinject", "mode": "diagonal"},
])
PLACEMENTS = ["random", "interleave", "bookend", "front", "back"]


@st.composite
def loop_sugars(draw, L: int, kinds: list[str], boundaries=("block", "mixer", "ffn", "selective", "elr")):
    """Loop sugar over ``L`` layers whose ops have ``kinds``."""
    boundary = draw(st.sampled_from(boundaries))
    T = draw(T_VALUES)
    out = {"boundary": boundary, "T": T, "update": draw(UPDATES),
           "conditioning": draw(st.sampled_from(["none", "index", "index_budget"]))}
    if boundary == "selective":
        lo = draw(st.integers(0, L - 1))
        out["select"] = {"ops": draw(st.sampled_from([["mixer"], ["ffn"], ["mixer", "ffn"]])),
                         "kinds": draw(st.sampled_from([None, *([k] for k in kinds)])),
                         "layers": draw(st.sampled_from([None, [lo, draw(st.integers(lo, L - 1))]]))}
        out["unit"] = draw(st.sampled_from(["op", "span"]))
    if boundary == "elr":
        pre = draw(st.integers(0, L - 1))
        rec = draw(st.integers(1, L - pre))
        out.update(prelude=pre, recurrent=rec, coda=L - pre - rec)
    if {"attn", "nsa"} & set(kinds) and draw(rare):
        out["windows"] = draw(st.lists(st.sampled_from(["full", 4, 8]), min_size=T, max_size=T))
    if "moe" in kinds and draw(rare):
        out["routing_replay"] = True
    return out


@st.composite
def elastics(draw):
    values = draw(st.lists(T_VALUES, min_size=1, max_size=4, unique=True))
    return {"train": {"values": values,
                      "weights": draw(st.lists(st.sampled_from([0.1, 0.5, 1.0]), min_size=len(values),
                                               max_size=len(values)))},
            "switch_at": draw(st.sampled_from([0.0, 0.75])),
            "eval": draw(st.lists(T_VALUES, min_size=1, max_size=4, unique=True))}


@st.composite
def arch_dicts(draw):
    """A whole source spec: explicit layers, or a hybrid (random placement makes switches)."""
    L = draw(st.integers(1, 5))
    model = {"vocab_size": draw(st.integers(8, 300)), "width": draw(st.sampled_from(range(32, 129, 16))),
             "tie_embeddings": draw(flag), "norm": {"kind": draw(st.sampled_from(["rmsnorm", "layernorm"]))}}
    model["norm"]["zero_centered"] = model["norm"]["kind"] == "rmsnorm" and draw(rare)
    data: dict = {"name": "random", "model": model}
    if L >= 2 and draw(st.sampled_from([False, False, True])):
        a, b = draw(base_mixers()), draw(base_mixers())
        data.update(num_layers=L, layer={"mixer": a, "ffn": draw(ffns())},
                    hybrid={"ratio": {"a": draw(st.integers(1, 3)), "b": draw(st.integers(1, 3))},
                            "placement": draw(st.sampled_from(PLACEMENTS)),
                            "mixers": {"a": a, "b": b}})
    else:
        data["layers"] = [{"mixer": draw(mixers()), "ffn": draw(ffns()),
                           "norm_placement": draw(st.sampled_from(["pre", "pre", "post"]))} for _ in range(L)]
    layers = data.get("layers", [data.get("layer")])
    kinds = sorted({op["kind"] for layer in layers for op in layer.values() if isinstance(op, dict)})
    if "hybrid" in data:
        kinds += [m["kind"] for m in data["hybrid"]["mixers"].values()]
        kinds += ["switch"] if data["hybrid"]["placement"] == "random" else []
    n_loops = draw(st.sampled_from([1, 2, 1, 0]))
    if n_loops == 1:
        data["loop"] = draw(loop_sugars(L, kinds))
    elif n_loops == 2:  # an outer span with per-op loops nested inside it
        data["loop"] = [draw(loop_sugars(L, kinds, ("block", "elr"))),
                        draw(loop_sugars(L, kinds, ("mixer", "ffn")))]
    if n_loops and draw(flag):
        data["elastic"] = draw(elastics())
    data["kv_policy"] = draw(st.sampled_from(["per_loop", "last_loop"]))
    return data


def resolved(data: dict) -> ArchSpec:
    """The canonical spec, or the example is discarded: only valid specs are priced."""
    try:
        return resolve(spec_from_dict(data))
    except SpecError:
        assume(False)


def coverage(arch: ArchSpec) -> set[str]:
    """What a valid example exercises (``--hypothesis-show-statistics`` tallies them)."""
    out = {f"op {l.mixer.kind}" for l in arch.layers} | {f"op {l.ffn.kind}" for l in arch.layers}
    out |= {f"op {b.kind}" for l in arch.layers for b in getattr(l.mixer, "branches", ())}
    out |= {f"update {r.update.kind} {getattr(r.update, 'mode', '')}" for r in arch.loops}
    out |= {f"conditioning {r.conditioning}" for r in arch.loops}
    out.add(f"{len(arch.loops)} loop regions")
    flags = {"elastic": arch.elastic is not None, "schedule": any(r.schedule for r in arch.loops),
             "routing replay": any(r.routing_replay for r in arch.loops),
             "untied": not arch.model.tie_embeddings, "layernorm": arch.model.norm.kind == "layernorm",
             "zero-centred norm": arch.model.norm.zero_centered,
             "post-norm layer": any(l.norm_placement == "post" for l in arch.layers),
             "partial rotary": any(getattr(l.mixer, "rope_dim", None) for l in arch.layers),
             "qk norm over heads": any(getattr(l.mixer, "qk_norm_over", "head") == "heads" for l in arch.layers),
             "shared expert gate": any(getattr(l.ffn, "shared_expert_gate", False) for l in arch.layers)}
    return out | {name for name, on in flags.items() if on}


RANDOM = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                         HealthCheck.data_too_large])


# ---------------------------------------------------------------- parameters


def check_params(arch: ArchSpec) -> None:
    """Every count of the sheet equals the model built on the meta device, op by op."""
    model = build_model(arch, backend="torch", device="meta")
    sheet, params = cost(arch), dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    assert sheet.unique_params == unique_params(arch) == total
    embed = model.embed.weight.numel() + (model.lm_head.weight.numel() if hasattr(model, "lm_head") else 0)
    assert sheet.embedding_params == embed
    assert sheet.non_embedding_params == total - embed
    for row in sheet.figures.ops:
        assert row.params == numel(getattr(model.layers[row.layer], row.op, None)), row
    norms = [m for n, m in model.named_modules()
             if n == "norm" or n.rsplit(".", 1)[-1] in ("mixer_norm", "ffn_norm")]
    assert sheet.norm_params == sum(numel(m) for m in norms)
    for e in sheet.figures.extras:
        owned = [p for n, p in params.items() if n == e.name or n.startswith(e.name + ".")]
        assert e.params == sum(p.numel() for p in owned), e


@pytest.mark.parametrize("name", arch_names())
def test_shipped_params_equal_meta_model(name):
    check_params(load_arch(ARCHS / f"{name}.yaml"))


CHECKED: list[str] = []  # names of the valid random specs a property actually checked


@RANDOM
@given(data=arch_dicts())
def _random_params(data):
    arch = resolved(data)
    for label in coverage(arch):
        event(label)
    check_params(arch)
    CHECKED.append(arch.name)


def test_random_spec_params_equal_meta_model():
    """Invalid draws are discarded; the property must still check enough valid specs."""
    CHECKED.clear()
    _random_params()
    assert len(CHECKED) >= 200, f"only {len(CHECKED)} valid specs checked (400 on a full run)"


# ---------------------------------------------------------------- projection compute vs the FLOP counter
#
# The definition (MixerLoop §3.3, nas.cost) charges 2 × every active parameter of an op per
# token and application. torch's FlopCounterMode sees matmuls and convolutions, so:
#
#   2 × active params  =  nn.Linear weights          (counter: aten.mm / addmm in Linear modules)
#                       + depthwise short-conv weights (counter: aten.convolution, 2·C·W per token)
#                       + elementwise parameters      (biases, A_log, dt_bias, D, norm weights:
#                                                      no matmul, added at 2 FLOPs each)
#
# The counter also sees what the definition prices elsewhere: loop-extra matmuls (gated
# step, concat re-injection), the sheet's extras; and, inside a mixer, the matmuls of
# sequence mixing (the chunked delta-rule and SSD kernels, DSA's indexer scores; SDPA's
# fused CPU kernel has no formula in the counter and shows 0). nas.cost prices sequence
# mixing apart, in the recurrent form the chunked kernels do not follow, so here it is only
# bounded below. What is left of the counter's total after every sublayer and loop extra is
# the LM head, C_H = 2·V·d per token.


def _delta_kv(op: GDNSpec | KDASpec) -> tuple[int, int, int, int]:
    """K, V, value heads HV and value head dim dv of fla's GDN/KDA layout."""
    hv, dv = op.num_v_heads or op.num_heads, int(op.head_dim * op.expand_v)
    return op.num_heads * op.head_dim, hv * dv, hv, dv


def _conv_channels(op: Spec, d: int) -> int:
    """Channels of an op's depthwise short convolutions (0: none)."""
    if isinstance(op, (GDNSpec, KDASpec)) and op.use_short_conv:
        k, v, _, _ = _delta_kv(op)
        return 2 * k + v
    if isinstance(op, DeltaNetSpec) and op.use_short_conv:
        return 2 * round(d * op.expand_k) + round(d * op.expand_v)
    if isinstance(op, Mamba2Spec):
        return op.expand * d + 2 * op.n_groups * op.state_size
    return 0


def conv_params(op: Spec, d: int) -> int:
    """Short-conv weights (C·W) of one op."""
    if isinstance(op, ParallelSpec):
        return sum(conv_params(b, d) for b in op.branches)
    size = op.conv_kernel if isinstance(op, Mamba2Spec) else getattr(op, "conv_size", 0)
    return _conv_channels(op, d) * size


def elementwise_params(op: Spec, d: int) -> int:
    """Parameters of one op that no matmul or convolution applies."""
    if isinstance(op, ParallelSpec):  # + branch norms (d, 2d for layernorm) and scales (d) per branch
        n, norm = len(op.branches), op.branch_norm
        own = n * d * ((2 if norm.kind == "layernorm" else 1) if norm else 0) + (n * d if op.branch_scale else 0)
        return sum(elementwise_params(b, d) for b in op.branches) + own
    conv_bias = getattr(op, "conv_bias", getattr(op, "use_conv_bias", False))
    out = _conv_channels(op, d) if conv_bias else 0
    if isinstance(op, GDNSpec):
        _, _, hv, dv = _delta_kv(op)
        return out + 2 * hv + dv  # A_log, dt_bias (HV each), o_norm (dv)
    if isinstance(op, KDASpec):
        _, v, hv, dv = _delta_kv(op)
        return out + hv + hv * op.head_dim + v + dv  # A_log, dt_bias (HV·dk), g_proj bias, o_norm
    if isinstance(op, DeltaNetSpec):
        return out + round(d * op.expand_v) // op.num_heads  # o_norm (dv)
    if isinstance(op, Mamba2Spec):
        inner, proj = op.expand * d, 2 * op.expand * d + 2 * op.n_groups * op.state_size + op.num_heads
        return (out + 2 * op.num_heads + (inner if op.rmsnorm else 0)  # dt_bias, A_log, gated norm
                + (inner if op.D_has_hdim else op.num_heads) + ((proj + d) if op.use_bias else 0))
    if isinstance(op, (AttnSpec, DSASpec, NSASpec)):
        q, kv = op.num_heads * op.head_dim, (op.num_kv_heads or op.num_heads) * op.head_dim
        qk = getattr(op, "qk_norm", False)
        norms = (q + kv if getattr(op, "qk_norm_over", "head") == "heads" else 2 * op.head_dim) if qk else 0
        norms *= 2 if getattr(qk, "kind", None) == "layernorm" else 1
        return (q + 2 * kv if op.qkv_bias else 0) + norms
    return 0  # FFNs: bias-free Linears only


def split_params(module: nn.Module | None) -> tuple[int, int]:
    """(short-conv weights, everything that is neither a Linear nor a conv weight)."""
    if module is None:
        return 0, 0
    conv = sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Conv1d))
    linear = sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))
    return conv, numel(module) - linear - conv


class Measured(NamedTuple):
    """What the counter saw in one forward, per token: projection compute of each sublayer
    ``(layer, op)`` over all its applications, loop-extra matmuls of each region, the head."""

    ops: dict[tuple[int, str], float]
    extras: dict[int, float]
    head: float


def run_counted(model: LoopLM, ids: torch.Tensor, loops: int | None) -> tuple[int, dict[str, dict[str, int]]]:
    """Total FLOPs and FLOPs by module name (``layers.0.mixer.q_proj``) and aten op."""
    # the plain op-per-module forms: the fused CPU fast paths compute the same function but
    # run several modules' weights in one matmul, which the counter cannot attribute
    with torch.no_grad(), fast.reference_paths(), FlopCounterMode(display=False) as counter:
        model(ids, loops=loops)
    root = type(model).__name__ + "."
    by_module = {name.removeprefix(root): {str(op): f for op, f in ops.items()}
                 for name, ops in counter.get_flop_counts().items() if name.startswith(root)}
    return counter.get_total_flops(), by_module


def measure(model: LoopLM, ids: torch.Tensor, loops: int | None = None,
            pattern: list[int] | None = None) -> Measured:
    """Count one forward pass; ``pattern``: the random-placement option of each layer."""
    arch, d, n = model.arch, model.arch.model.width, ids.numel()
    total, by_module = run_counted(model, ids, loops)
    apps = counts(arch, loops).apps

    def linear(prefix: str) -> int:
        return sum(sum(by_module.get(name, {}).values()) for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and name.startswith(prefix + "."))

    ops, seen = {}, 0
    for i, layer in enumerate(arch.layers):
        for which in ("mixer", "ffn"):
            name, spec = f"layers.{i}.{which}", getattr(layer, which)
            module = getattr(model.layers[i], which, None)
            if isinstance(spec, SwitchSpec):
                spec, module = spec.options[pattern[i]], module.options[pattern[i]]
            # the accounting's non-matmul parameters are exactly the module's
            assert split_params(module) == (conv_params(spec, d), elementwise_params(spec, d)), name
            flops = by_module.get(name, {})
            mm, conv = linear(name), flops.get("aten.convolution", 0)
            assert conv == 2 * n * apps[2 * i + (which == "ffn")] * conv_params(spec, d), name
            seq = sum(flops.values()) - mm - conv  # sequence mixing: not projection compute
            assert seq >= 0 if which == "mixer" else seq == 0, name
            ops[i, which] = (mm + conv) / n + 2 * apps[2 * i + (which == "ffn")] * elementwise_params(spec, d)
            seen += sum(flops.values())
    extras = {j: linear(f"loops.{j}") / n for j in range(len(arch.loops))}
    head = (total - seen - n * sum(extras.values())) / n
    return Measured(ops, extras, head)


def loop_extra_matmuls(arch: ArchSpec, fig: Figures) -> dict[int, float]:
    """The sheet's loop-extra FLOPs per region, less the gated step's bias (d adds per
    update, 2 FLOPs per parameter by the convention, but no matmul)."""
    ups, d = counts(arch, fig.loops).updates, arch.model.width
    return {j: sum(e.flops for e in fig.extras if e.name.startswith(f"loops.{j}."))
            - (2 * d * ups[j] if r.update.kind == "gated_step" else 0)
            for j, r in enumerate(arch.loops)}


def check_projection(model: LoopLM, fig: Figures, ids: torch.Tensor, loops: int | None = None) -> Measured:
    """The counter's forward pass against the sheet's figures at the same loop count."""
    got = measure(model, ids, loops)
    assert got.ops == {(r.layer, r.op): r.projection_flops for r in fig.ops}
    assert got.head == fig.projection.head
    assert projection_flops(model.arch, loops) == fig.projection  # the sheet-free path agrees
    assert got.extras == loop_extra_matmuls(model.arch, fig)
    return got


def tokens(arch: ArchSpec, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, arch.model.vocab_size, (1, TOKENS), generator=g)


def built(arch: ArchSpec) -> LoopLM:
    torch.manual_seed(0)
    return build_model(arch, backend="torch").eval()


@pytest.mark.parametrize("name", TINY)
def test_tiny_projection_equals_counted_matmuls(name):
    arch = load_arch(ARCHS / f"{name}.yaml")
    check_projection(built(arch), cost(arch).figures, tokens(arch))


def test_routing_replay_skips_the_router():
    """tiny_moe_replay: the recurrent MoE routes in the first of T loops only, later loops
    replay that routing, so the counter sees the router (d × E) once and the experts T
    times; without replay the router runs every loop."""
    arch = load_arch(ARCHS / "tiny_moe_replay.yaml")
    fresh = arch.model_copy(update={"loops": tuple(r.model_copy(update={"routing_replay": False})
                                                   for r in arch.loops)})
    replayed, dynamic = (check_projection(built(a), cost(a).figures, tokens(a)).ops[1, "ffn"]
                         for a in (arch, fresh))
    T, moe = arch.loops[0].T, arch.layers[1].ffn
    assert dynamic - replayed == 2 * arch.model.width * moe.num_experts * (T - 1)


FLOPS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                        HealthCheck.data_too_large])


@FLOPS
@given(data=arch_dicts())
def _random_projection(data):
    arch = resolved(data)
    assume(arch.random_placement is None)
    model, sheet, ids = built(arch), cost(arch), tokens(arch)
    check_projection(model, sheet.figures, ids)
    for fig in sheet.per_k:
        check_projection(model, fig, ids, loops=fig.loops)
    CHECKED.append(arch.name)


def test_random_spec_projection_equals_counted_matmuls():
    """Random placement resamples its pattern; it is checked pattern by pattern below.
    Discarded draws (invalid, random placement) must leave enough specs checked."""
    CHECKED.clear()
    _random_projection()
    assert len(CHECKED) >= 20, f"only {len(CHECKED)} valid specs checked (30 on a full run)"


# Constructed tiny specs for what the shipped ones leave out: the other linear mixers with
# every bias and norm switched on, NSA, GQA attention with qk_norm and qkv biases, untied
# layernorm models, MoE without replay, the loop-extra matmuls, parallel mean/sum.
CONSTRUCTED = {
    "gdn_noloop": """
model: {vocab_size: 96, width: 64, defaults: {gdn: {num_heads: 2, head_dim: 32, expand_v: 1}}}
num_layers: 2
layer: {mixer: {kind: gdn}, ffn: {kind: swiglu, hidden_size: 128}}
""",
    "gdn_mixerloop_gated_step": """
model: {vocab_size: 96, width: 64, defaults: {gdn: {num_heads: 2, head_dim: 16, expand_v: 2, num_v_heads: 4}}}
num_layers: 2
layer: {mixer: {kind: gdn, use_gate: false, conv_bias: true}, ffn: {kind: swiglu, hidden_size: 96}}
loop: {boundary: mixer, T: 3, update: {kind: gated_step}}
""",
    "gdn_huginn_from_first": """
model: {vocab_size: 96, width: 64, defaults: {gdn: {num_heads: 2, head_dim: 32}}}
num_layers: 3
layer: {mixer: {kind: gdn}, ffn: {kind: swiglu, hidden_size: 128}}
loop: {boundary: elr, prelude: 1, recurrent: 1, coda: 1, T: 3, truncate: 2, iteration_norm: true,
       update: {kind: reinject, mode: concat, initial_state: random}}
""",
    "gdn_fullloop_concat": """
model: {vocab_size: 96, width: 64, tie_embeddings: false, defaults: {gdn: {num_heads: 2, head_dim: 32}}}
num_layers: 2
layer: {mixer: {kind: gdn}, ffn: {kind: swiglu, hidden_size: 128}}
loop: {boundary: block, T: 3, update: {kind: reinject, mode: concat}, conditioning: index}
""",
    "attn_hybrid": """
model: {vocab_size: 80, width: 64, tie_embeddings: false, norm: {kind: layernorm}}
num_layers: 4
hybrid:
  ratio: {full: 1, lin: 3}
  placement: bookend
  mixers:
    full: {kind: attn, num_heads: 4, num_kv_heads: 2, qk_norm: true, qkv_bias: true, output_gate: true}
    lin: {kind: deltanet, num_heads: 4, use_gate: true, conv_bias: true, expand_k: 0.5}
layer: {mixer: {kind: attn}, ffn: {kind: swiglu, hidden_size: 64}}
loop:
  boundary: selective
  select: {ops: [mixer], kinds: [deltanet]}
  T: 2
  update: {kind: residual_gate, shared: false}
""",
    "moe_kda_mamba2": """
model: {vocab_size: 64, width: 48}
layers:
  - mixer: {kind: kda, num_heads: 2, head_dim: 16, num_v_heads: 4, conv_bias: true}
    ffn: {kind: moe, num_experts: 4, top_k: 2, expert_hidden: 32}
  - mixer: {kind: mamba2, head_dim: 16, state_size: 8, n_groups: 2, use_bias: true, D_has_hdim: true}
    ffn: {kind: moe, num_experts: 3, top_k: 1, expert_hidden: 16, shared_expert_hidden: 24}
  - mixer: {kind: nsa, num_heads: 4, num_kv_heads: 1, head_dim: 8, block_size: 4, block_counts: 2,
            window: 8, qkv_bias: true}
    ffn: {kind: none}
loop: {boundary: ffn, T: 2, update: {kind: reinject, mode: add}}
""",
    "parallel_sum_dsa": """
model: {vocab_size: 64, width: 32}
num_layers: 2
layer:
  mixer:
    kind: parallel
    combine: sum
    branches:
      - {kind: dsa, num_heads: 2, index_heads: 2, index_head_dim: 8, topk: 4, qk_norm: true}
      - {kind: mamba2, head_dim: 8, state_size: 4, rmsnorm: false}
  ffn: {kind: swiglu, hidden_size: 32}
loop: {boundary: elr, prelude: 0, recurrent: 1, coda: 1, T: 4, update: {kind: gated_step},
       conditioning: index_budget}
""",
    "parallel_hymba_layernorm_concat": """
model: {vocab_size: 64, width: 32, norm: {kind: layernorm}}
num_layers: 2
layer:
  mixer:
    kind: parallel
    combine: concat
    branch_norm: true
    branch_scale: true
    branches:
      - {kind: kda, num_heads: 2, head_dim: 8}
      - {kind: attn, num_heads: 2, window: 4}
  ffn: {kind: swiglu, hidden_size: 32}
loop: {boundary: mixer, T: 2, update: {kind: residual_gate}}
""",
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTED))
def test_constructed_projection_equals_counted_matmuls(name):
    arch = loads_arch(CONSTRUCTED[name])
    check_projection(built(arch), cost(arch).figures, tokens(arch))


def test_random_placement_pattern_by_pattern(monkeypatch):
    """tiny_lt2_interleave with placement: random. Every distinct pattern (a permutation
    of the ratio's names, all equally likely) is counted; each matches its own options'
    projection compute, and their mean is the sheet's expected cost."""
    text = (ARCHS / "tiny_lt2_interleave.yaml").read_text()
    arch = loads_arch(text.replace("placement: interleave", "placement: random"))
    model, sheet, ids, d = built(arch).train(), cost(arch), tokens(arch), arch.model.width
    per_option = ratio_counts(arch.random_placement.ratio, arch.L).values()
    names = [i for i, c in enumerate(per_option) for _ in range(c)]
    patterns = sorted(set(itertools.permutations(names)))
    assert len(patterns) == math.comb(arch.L, names.count(0))
    rows = {(r.layer, r.op): r for r in sheet.figures.ops}
    mean = dict.fromkeys(rows, 0.0)
    for pattern in patterns:
        monkeypatch.setattr(model, "_pattern", lambda: list(pattern))
        got = measure(model, ids, pattern=list(pattern))
        for (i, op), row in rows.items():
            spec = getattr(arch.layers[i], op)
            spec = spec.options[pattern[i]] if isinstance(spec, SwitchSpec) else spec
            assert got.ops[i, op] == 2 * row.applications * op_active_params(spec, d)
            mean[i, op] += got.ops[i, op] / len(patterns)
        assert got.head == sheet.figures.projection.head
    assert mean == pytest.approx({k: r.projection_flops for k, r in rows.items()}, rel=1e-12)


def test_elastic_per_k_equals_counted_matmuls():
    """tiny_elr: one checkpoint at k = 1..4 loops; at k = 1 it is the plain model, counted
    op for op, sequence mixing included."""
    arch = load_arch(ARCHS / "tiny_elr.yaml")
    model, sheet, ids = built(arch), cost(arch), tokens(arch)
    per_k = [check_projection(model, sheet.at(k), ids, loops=k) for k in (1, 2, 3, 4)]
    step = sum(per_k[0].ops[r.layer, r.op] for r in sheet.at(2).ops if r.applications == 2)  # recurrent block
    totals = [sum(m.ops.values()) for m in per_k]
    assert [b - a for a, b in zip(totals, totals[1:])] == [step] * 3
    plain = arch.model_copy(update={"loops": (), "elastic": None})
    plain_model = built(plain)
    assert measure(plain_model, ids) == per_k[0]._replace(extras={})
    assert run_counted(plain_model, ids, None) == run_counted(model, ids, 1)
    assert sheet.at(1).projection == cost(plain).figures.projection and sheet.at(1).loop_extra_flops == 0
