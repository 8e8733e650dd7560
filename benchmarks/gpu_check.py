"""One-shot GPU check: the fla path against the torch path, then train-step throughput.

Run on one CUDA GPU (sized for an H200, about 5 minutes):

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json

1. For each mixer with an fla layer (gdn, deltanet, kda, mamba2, attn, nsa) and SwiGLU:
   the same weights in the torch-backend module and the fla-backend module, random input,
   relative error ``|y_fla - y_torch| / |y_torch|`` of the output and of the input
   gradient, in float32 and bf16.
2. Train-step throughput (tokens/s, fwd + bwd + AdamW, bf16 autocast) of the MixerLoop
   paper specs (15M and 110M; NoLoop, FullLoop, MixerLoop) on the fla backend, and, side
   by side, fla's own ``GatedDeltaNetForCausalLM`` of the NoLoop geometry.

Writes one JSON file and prints a table. ``--smoke`` runs step 1 on CPU at tiny shapes
in float32, fla's real kernels under Triton's interpreter against the torch path (so it
fails when the two disagree), and step 2 on the torch backend only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
# run as a script, sys.path starts at this folder, whose spaces/ would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from builders.model import build_model
from builders.registry import BuildCtx, build_op
from nas import ArchSpec
from nas.load import load_arch
from nas.spec import (
    AttnSpec, DeltaNetSpec, GDNSpec, KDASpec, Mamba2Spec, NSASpec, SwiGLUSpec,
)
from spaces import ARCHS

warnings.filterwarnings("ignore")

OPS = {
    "gdn": GDNSpec(num_heads=4, head_dim=64, expand_v=1),
    "deltanet": DeltaNetSpec(num_heads=4),
    "kda": KDASpec(num_heads=4, head_dim=64),
    "mamba2": Mamba2Spec(head_dim=64, state_size=64, chunk_size=64),
    "attn": AttnSpec(num_heads=4),
    "attn_swa": AttnSpec(num_heads=4, window=128),
    "nsa": NSASpec(num_heads=16, num_kv_heads=1, head_dim=16, block_size=16, block_counts=4, window=64),
    "swiglu": SwiGLUSpec(hidden_size=512),
}
SMOKE_OPS = {
    "gdn": GDNSpec(num_heads=2, head_dim=16, expand_v=1),
    "deltanet": DeltaNetSpec(num_heads=2),
    "kda": KDASpec(num_heads=2, head_dim=16),
    "mamba2": Mamba2Spec(head_dim=16, state_size=16, chunk_size=16),
    "attn": AttnSpec(num_heads=4),
    "attn_swa": AttnSpec(num_heads=4, window=8),
    "nsa": NSASpec(num_heads=16, num_kv_heads=1, head_dim=16, block_size=16, block_counts=3, window=8),
    "swiglu": SwiGLUSpec(hidden_size=96),
}
SPECS = ["noloop_15m", "fullloop_15m", "mixerloop_15m", "noloop_110m", "fullloop_110m", "mixerloop_110m"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _run(module, x):
    x = x.clone().requires_grad_()
    y = module(x)
    y.float().square().mean().backward()
    return y.detach(), x.grad.detach()


def op_errors(ops: dict, device: str, width: int, T: int, dtypes: tuple) -> list[dict]:
    """Per op and dtype: relative error of the fla-backend module against the torch one."""
    rows = []
    for name, spec in ops.items():
        for dtype in dtypes:
            torch.manual_seed(0)
            ref = build_op(spec, BuildCtx(width=width, backend="torch")).to(device, dtype)
            fla = build_op(spec, BuildCtx(width=width, backend="fla")).to(device, dtype)
            fla.load_state_dict(ref.state_dict())
            x = torch.randn(2, T, width, device=device, dtype=dtype)
            try:
                (y0, g0), (y1, g1) = _run(ref, x), _run(fla, x)
                row = {"op": name, "dtype": str(dtype).split(".")[-1], "fla_class": type(fla).__name__,
                       "out_rel_err": _rel(y1, y0), "grad_rel_err": _rel(g1, g0)}
            except Exception as exc:  # one op failing must not hide the others
                row = {"op": name, "dtype": str(dtype).split(".")[-1], "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
    return rows


def _time_steps(model, vocab: int, batch: int, T: int, steps: int, device: str, amp: bool) -> float:
    """Tokens per second over ``steps`` timed train steps after two warm-up steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    ids = torch.randint(0, vocab, (batch, T), device=device)
    labels = torch.roll(ids, -1, 1)

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return batch * T * steps / (time.perf_counter() - t0)


def fla_reference_model(arch: ArchSpec):
    """fla's own GatedDeltaNetForCausalLM with the geometry of a NoLoop GDN spec."""
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    m, layer = arch.model, arch.layers[0]
    cfg = GatedDeltaNetConfig(
        hidden_size=m.width, num_hidden_layers=len(arch.layers), vocab_size=m.vocab_size,
        num_heads=layer.mixer.num_heads, head_dim=layer.mixer.head_dim, expand_v=layer.mixer.expand_v,
        use_gate=layer.mixer.use_gate, conv_size=layer.mixer.conv_size,
        intermediate_size=layer.ffn.hidden_size, tie_word_embeddings=m.tie_embeddings,
        fuse_cross_entropy=False, fuse_linear_cross_entropy=False)
    return GatedDeltaNetForCausalLM(cfg)


def throughput(specs: list[ArchSpec], device: str, backend: str, batch: int, T: int,
               steps: int, with_fla_model: bool) -> list[dict]:
    rows, amp = [], device == "cuda"
    for arch in specs:
        torch.manual_seed(0)
        model = build_model(arch, backend=backend, device=device)
        row = {"spec": arch.name, "backend": backend, "batch": batch, "seq_len": T,
               "tokens_per_s": _time_steps(model, arch.model.vocab_size, batch, T, steps, device, amp)}
        del model
        if with_fla_model and not arch.loops:
            ref = fla_reference_model(arch).to(device)
            row["fla_model_tokens_per_s"] = _time_steps(ref, arch.model.vocab_size, batch, T, steps, device, amp)
            row["ratio_vs_fla_model"] = row["tokens_per_s"] / row["fla_model_tokens_per_s"]
            del ref
        rows.append(row)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _table(result: dict) -> str:
    lines = ["op         dtype     out rel err   grad rel err   fla class"]
    for r in result["ops"]:
        if "error" in r:
            lines.append(f"{r['op']:<10} {r['dtype']:<9} ERROR {r['error']}")
        else:
            lines.append(f"{r['op']:<10} {r['dtype']:<9} {r['out_rel_err']:>11.2e}   "
                         f"{r['grad_rel_err']:>12.2e}   {r['fla_class']}")
    lines.append("")
    lines.append("spec              tokens/s     fla GatedDeltaNetForCausalLM   ratio")
    for r in result["throughput"]:
        ref = r.get("fla_model_tokens_per_s")
        extra = f"{ref:>14,.0f}   {r['ratio_vs_fla_model']:.3f}" if ref else ""
        lines.append(f"{r['spec']:<16} {r['tokens_per_s']:>10,.0f}   {extra}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_check.json"))
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run: fla under Triton's interpreter vs torch")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device here; --smoke runs the CPU check (fla under Triton's interpreter)")
    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    if smoke:
        specs = [load_arch(ARCHS / f"tiny_{n}.yaml") for n in ("noloop", "fullloop", "mixerloop")]
        ops = op_errors(SMOKE_OPS, device, width=32, T=37, dtypes=(torch.float32,))
        tput = throughput(specs, device, "torch", batch=2, T=32, steps=1, with_fla_model=False)
    else:
        specs = [load_arch(ARCHS / f"{n}.yaml") for n in SPECS]
        ops = op_errors(OPS, device, width=256, T=512, dtypes=(torch.float32, torch.bfloat16))
        tput = throughput(specs, device, "fla", batch=16, T=1024, steps=10, with_fla_model=True)
    result = {
        "command": "python " + " ".join(sys.argv), "smoke": smoke, "device": torch.cuda.get_device_name() if not smoke else platform.processor() or "cpu",
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "ops": ops, "throughput": tput,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, args.out)
    print(_table(result))


if __name__ == "__main__":
    main()
