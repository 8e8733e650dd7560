"""Runs fla's real Triton kernels on CPU (Triton's interpreter) against the torch backend.

    python -m tests._fla_interp_worker OUT.json [ops|specs|CASE ...]

Sets ``TRITON_INTERPRET=1`` before anything imports triton, so it runs in its own
process (``tests/builders/test_fla_interpreter.py`` launches it). Each case builds the torch
module and the fla one with the same weights, runs both on the same input in float32,
and records, for the output and every gradient (input, parameters), the largest
absolute difference and the largest absolute reference value. The test asserts on them.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported, by anything

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from builders.layers.fla_runtime import install_interpreter_shims  # noqa: E402
from builders.model import build_model  # noqa: E402
from builders.ops.conv import causal_conv1d  # noqa: E402
from builders.ops.norm import rms_norm_gated  # noqa: E402
from builders.registry import BuildCtx, build_op  # noqa: E402
from nas.load import load_arch  # noqa: E402
from nas.spec import (  # noqa: E402
    AttnSpec, DeltaNetSpec, GDNSpec, KDASpec, Mamba2Spec, NSASpec, SwiGLUSpec,
)
from spaces import ARCHS  # noqa: E402

warnings.filterwarnings("ignore")
install_interpreter_shims()
WIDTH = 32

# Layers with an fla path, at small awkward shapes: (spec, B, T)
LAYERS = {
    "gdn-B2-T37-H2-D16": (GDNSpec(num_heads=2, head_dim=16, expand_v=1), 2, 37),
    "gdn-B1-T70-H2-D16-v2": (GDNSpec(num_heads=2, head_dim=16, expand_v=2, use_gate=False), 1, 70),
    "deltanet-B2-T37-H2": (DeltaNetSpec(num_heads=2), 2, 37),
    "kda-B1-T37-H2-D16": (KDASpec(num_heads=2, head_dim=16), 1, 37),
    "mamba2-B2-T37-P16-N16": (Mamba2Spec(head_dim=16, state_size=16, chunk_size=16), 2, 37),
    "attn-B2-T37-H4-KV2-qknorm": (AttnSpec(num_heads=4, num_kv_heads=2, qk_norm=True), 2, 37),
    "attn-B1-T37-H4-w8": (AttnSpec(num_heads=4, window=8), 1, 37),
    "nsa-B1-T37-HQ16-H1-bs16-S3-w8": (NSASpec(num_heads=16, num_kv_heads=1, head_dim=16, block_size=16,
                                               block_counts=3, window=8), 1, 37),
    "swiglu-B2-T37": (SwiGLUSpec(hidden_size=96), 2, 37),
}
TINY = sorted(p.stem for p in ARCHS.glob("tiny_*.yaml"))
SPEC_BATCH, SPEC_T = 1, 24


def _perturbed(module, scale: float):
    """Noise on every parameter, so those that init at 0 or 1 (gates, norms, biases) count too."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def _diff(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """[max |a - b|, max |b|]."""
    return [float((a - b).abs().max()), float(b.abs().max())]


def _grads(module, inputs: dict[str, torch.Tensor], run) -> dict[str, torch.Tensor]:
    """Output (or loss) and the gradient of every input and parameter under a fixed cotangent."""
    inputs = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    out = run(module, **inputs)
    torch.manual_seed(1)
    out.backward(torch.randn(out.shape).to(out.dtype))  # randn_like would follow out's strides
    grads = {"out": out.detach()}
    grads |= {f"grad:{k}": v.grad for k, v in inputs.items()}
    grads |= {f"grad:{n}": (p.grad if p.grad is not None else torch.zeros_like(p))
              for n, p in module.named_parameters()}
    return grads


def _compare(ref, fla, inputs, run) -> dict:
    a, b = _grads(fla, inputs, run), _grads(ref, inputs, run)
    return {"errors": {k: _diff(a[k], b[k]) for k in b}}


def layer_case(name: str) -> dict:
    spec, B, T = LAYERS[name]
    torch.manual_seed(0)
    ref = _perturbed(build_op(spec, BuildCtx(width=WIDTH, backend="torch")), 0.1)
    fla = build_op(spec, BuildCtx(width=WIDTH, backend="fla"))
    fla.load_state_dict(ref.state_dict(), strict=True)
    out = _compare(ref, fla, {"x": torch.randn(B, T, WIDTH)}, lambda m, x: m(x))
    return {**out, "fla_class": type(fla).__name__}


def _fla_conv(x, weight, bias, activation):
    from fla.modules.convolution import causal_conv1d as fla_causal_conv1d
    return fla_causal_conv1d(x, weight, bias, activation=activation)[0]


def _fla_gated_norm(x, g, weight, activation):
    from fla.modules.norm.fused_norm_gate import rms_norm_gated as fla_rms_norm_gated
    return fla_rms_norm_gated(x, g, weight, None, activation=activation, eps=1e-5)


def _fla_group_norm(x, g, weight, group_size):
    from fla.modules.norm.layernorm_gated import rmsnorm_fn
    return rmsnorm_fn(x, weight, None, z=g, eps=1e-5, group_size=group_size, norm_before_gate=False)


class _Fn(torch.nn.Module):
    """A functional op with its parameters, so ``_compare`` treats it as a module."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, torch.nn.Parameter(v.clone()))

    def forward(self, **inputs):
        return self.fn(**inputs, **dict(self.named_parameters()))


def _conv_case(activation):
    D, W = 24, 4
    params = dict(weight=torch.randn(D, W), bias=torch.randn(D))
    ref = _Fn(lambda x, weight, bias: causal_conv1d(x, weight, bias, activation), **params)
    fla = _Fn(lambda x, weight, bias: _fla_conv(x, weight, bias, activation), **params)
    return _compare(ref, fla, {"x": torch.randn(2, 37, D)}, lambda m, **kw: m(**kw))


def _norm_case(activation):
    D = 16
    params = dict(weight=1 + 0.1 * torch.randn(D))
    ref = _Fn(lambda x, g, weight: rms_norm_gated(x, g, weight, 1e-5, activation), **params)
    fla = _Fn(lambda x, g, weight: _fla_gated_norm(x, g, weight, activation), **params)
    inputs = {"x": torch.randn(2, 37, 2, D), "g": torch.randn(2, 37, 2, D)}
    return _compare(ref, fla, inputs, lambda m, **kw: m(**kw))


def _group_norm_case():
    D, group = 32, 16
    params = dict(weight=1 + 0.1 * torch.randn(D))
    ref = _Fn(lambda x, g, weight: rms_norm_gated(x, g, weight, 1e-5, "swish", group, norm_before_gate=False),
              **params)
    fla = _Fn(lambda x, g, weight: _fla_group_norm(x, g, weight, group), **params)
    inputs = {"x": torch.randn(2, 37, D), "g": torch.randn(2, 37, D)}
    return _compare(ref, fla, inputs, lambda m, **kw: m(**kw))


FUNCTIONS = {
    "causal_conv-B2-T37-D24-W4-silu": lambda: _conv_case("silu"),
    "causal_conv-B2-T37-D24-W4-linear": lambda: _conv_case(None),
    "gated_norm-B2-T37-H2-D16-swish": lambda: _norm_case("swish"),
    "gated_norm-B2-T37-H2-D16-sigmoid": lambda: _norm_case("sigmoid"),
    "gated_norm-B2-T37-D32-group16-mamba2": _group_norm_case,
}


def spec_case(name: str) -> dict:
    """A whole tiny model on both backends: the loss and every parameter's gradient."""
    arch = load_arch(ARCHS / f"{name}.yaml")
    torch.manual_seed(0)
    # at init the residual branches barely move the loss; noise makes every layer count
    ref = _perturbed(build_model(arch, backend="torch"), 0.05)
    fla = build_model(arch, backend="fla")
    fla.load_state_dict(ref.state_dict(), strict=True)
    ids = torch.randint(0, arch.model.vocab_size, (SPEC_BATCH, SPEC_T))
    state = torch.get_rng_state()  # random placement, if any, samples the same pattern

    def run(model, **_):
        torch.set_rng_state(state)
        return model(ids, labels=ids.roll(-1, 1)).loss

    out = _compare(ref, fla, {}, run)
    fla_modules = sorted({type(m).__name__ for m in fla.modules() if type(m).__name__.startswith("Fla")})
    return {**out, "fla_modules": fla_modules}


def cases(selection: list[str]) -> dict:
    groups = {"ops": [*LAYERS, *FUNCTIONS], "specs": TINY}
    names = [n for s in selection for n in groups.get(s, [s])]
    runners = {**{n: layer_case for n in LAYERS}, **{n: (lambda n: FUNCTIONS[n]()) for n in FUNCTIONS},
               **{n: spec_case for n in TINY}}
    return {n: runners[n] for n in names}


def main(argv: list[str]) -> None:
    out, selection = argv[0], argv[1:] or ["ops", "specs"]
    torch.set_num_threads(1)
    results = {}
    for name, run in cases(selection).items():
        torch.manual_seed(0)
        t0 = time.perf_counter()
        try:
            results[name] = run(name)
        except Exception as exc:  # one case failing must not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        worst = max((e / max(r, 1e-30) for e, r in results[name].get("errors", {}).values()), default=float("nan"))
        print(f"{name:<40} {results[name]['seconds']:6.1f}s  worst rel err {worst:.1e}", flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
