"""``loopnas doctor``: what this machine can run. The first command on a new node."""
from __future__ import annotations

import json
import platform
from importlib import metadata

from rich import box
from rich.table import Table

from . import app
from .common import JsonOpt, console

# distribution name → what it is for here
PACKAGES = {
    "torch": "required",
    "triton": "fla's kernels (Linux x86_64 / aarch64)",
    "flash-linear-attention": "the fla backend",
    "flash-attn": "optional, unused: attention runs PyTorch SDPA",
    "mamba-ssm": "optional: fla Mamba2's fused CUDA path",
    "ray": "sweeps",
    "optuna": "sweeps",
}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torch_build(torch) -> str:
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip}"
    return "CPU only"


def _gpus(torch) -> list[str]:
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)")
    return out


def _kernel_check(torch) -> str:
    """A tiny GDN layer on CUDA, fla against torch with the same weights: compiles the kernels."""
    from builders.registry import BuildCtx, build_op
    from nas.spec import GDNSpec

    spec = GDNSpec(num_heads=2, head_dim=32, expand_v=1)
    ref = build_op(spec, BuildCtx(width=64, backend="torch")).cuda()
    fla = build_op(spec, BuildCtx(width=64, backend="fla")).cuda()
    fla.load_state_dict(ref.state_dict())
    x = torch.randn(2, 100, 64, device="cuda")
    with torch.no_grad():
        y_ref, y_fla = ref(x), fla(x)
    err = float((y_fla - y_ref).norm() / y_ref.norm())
    return f"ok (GDN fla vs torch, rel err {err:.1e})" if err < 1e-3 else f"MISMATCH (rel err {err:.1e})"


def diagnose() -> dict:
    import torch

    from builders.layers.fla_runtime import interpreting, unavailable_reason
    from builders.model import resolve_backend

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    reason = unavailable_reason(device)
    report = {
        "python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}",
        "torch_build": _torch_build(torch), "cuda_available": cuda, "gpus": _gpus(torch) if cuda else [],
        "packages": {dist: _version(dist) for dist in PACKAGES},
        "triton_interpret": interpreting(),
        "fla_backend": "usable" if reason is None else f"not usable: {reason}",
        "auto_backend": resolve_backend("auto", device),
    }
    if cuda and reason is None:
        try:
            report["fla_kernels"] = _kernel_check(torch)
        except Exception as exc:  # the point of the command is to say what broke
            report["fla_kernels"] = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return report


def _table(report: dict) -> Table:
    table = Table(box=box.SIMPLE, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("python", f"{report['python']} on {report['platform']}")
    table.add_row("torch build", report["torch_build"])
    table.add_row("CUDA", "available" if report["cuda_available"] else "not available")
    for gpu in report["gpus"]:
        table.add_row("GPU", gpu)
    for dist, why in PACKAGES.items():
        table.add_row(dist, f"{report['packages'][dist] or 'not installed'}  ({why})")
    if report["triton_interpret"]:
        table.add_row("TRITON_INTERPRET", "on: Triton kernels run on CPU, slowly (tests)")
    table.add_row("fla backend", report["fla_backend"])
    if "fla_kernels" in report:
        table.add_row("fla kernels", report["fla_kernels"])
    table.add_row("backend=auto", f"{report['auto_backend']} (for a model placed on "
                  f"{'cuda' if report['cuda_available'] else 'cpu'})")
    return table


@app.command("doctor")
def doctor_cmd(as_json: JsonOpt = False) -> None:
    """The torch build, CUDA and GPUs, fla/triton/Ray/Optuna versions, and whether the fla backend runs here.

    On a CUDA machine it also runs a tiny GDN layer through fla's kernels against the torch
    twin. Example:

        loopnas doctor
    """
    report = diagnose()
    if as_json:
        console.print_json(json.dumps(report))
    else:
        console.print(_table(report))
