"""The fla backend computes the torch backend's function: fla's real Triton kernels, on CPU.

``tests/builders/_fla_interp_worker.py`` runs every op with an fla path (gdn, deltanet, kda,
mamba2, attn, nsa, swiglu, fla's causal conv and gated norms) and every tiny spec end to
end under Triton's interpreter, in subprocesses (``TRITON_INTERPRET=1`` must be set
before triton is imported, which would change the rest of the suite). Both sides run in
float32 on the same weights and input; every output and gradient must agree to
``RTOL`` of its largest reference value. The worst measured is about 1.2e-5 (fla's
gate gradient for GDN over two chunks, where fla itself is 1.4e-5 from a float64
truth); a wrong sign or a dropped term gives errors of order 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spaces import ARCHS
from helpers import REPO

ROOT = REPO
RTOL = 5e-5
TINY = sorted(p.stem for p in ARCHS.glob("tiny_*.yaml"))
OP_KINDS = ["gdn", "deltanet", "kda", "mamba2", "attn", "nsa", "swiglu", "causal_conv", "gated_norm"]
# two processes for CI's two cores: the ops and half the specs, the other half
SHARDS = [["ops", *TINY[::2]], TINY[1::2]]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fla_interp")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.builders._fla_interp_worker", str(out / f"{i}.json"), *shard],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, shard in enumerate(SHARDS)]
    merged = {}
    for i, proc in enumerate(procs):
        log, _ = proc.communicate(timeout=1200)
        assert proc.returncode == 0, log[-3000:]
        merged |= json.loads((out / f"{i}.json").read_text())
    return merged


def _check(name: str, case: dict) -> None:
    assert "error" not in case, f"{name}: {case['error']}"
    bad = {k: f"{e:.1e} of {r:.1e}" for k, (e, r) in case["errors"].items() if e > RTOL * r}
    assert not bad, f"{name}: {bad}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", OP_KINDS)
def test_op_matches_torch_under_interpreter(results, kind):
    names = [n for n in results if n.split("-")[0] == kind]
    assert names, f"no interpreter case for {kind}"
    for name in names:
        _check(name, results[name])
        assert results[name].get("fla_class", "Fla").startswith("Fla"), f"{name} did not run fla's layer"


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_tiny_spec_loss_and_every_grad_match(results, name):
    case = results[name]
    _check(name, case)
    assert case["fla_modules"], f"{name} built no fla module on the fla backend"
    assert {"out"} < set(case["errors"]) and all(k.startswith("grad:") for k in case["errors"] if k != "out")


# Without the interpreter (this process): backend="fla" off CUDA is one clear error.

def test_fla_backend_on_cpu_is_one_usage_error():
    import torch

    from builders.layers.fla_runtime import FlaUnavailableError
    from builders.model import build_model, resolve_backend
    from nas.load import load_arch

    arch = load_arch(ARCHS / "tiny_noloop.yaml")
    with pytest.raises(FlaUnavailableError, match="CUDA device"):
        build_model(arch, backend="fla", device="cpu")
    model = build_model(arch, backend="fla")  # built on the CPU to be moved later: allowed
    with pytest.raises(FlaUnavailableError, match="backend='torch' or 'auto'"):
        model(torch.zeros(1, 8, dtype=torch.long))
    assert resolve_backend("auto", "cpu") == resolve_backend("auto", None) == "torch"
    assert resolve_backend("fla", "meta") == "fla"
    with pytest.raises(ValueError, match="backend must be"):
        resolve_backend("triton", None)


def test_fla_nsa_rejects_fewer_slots_than_forced_blocks():
    from builders.layers.attention import make_fla

    with pytest.raises(ValueError, match="block_counts >= 3"):
        make_fla("nsa", hidden_size=32, num_heads=16, num_kv_heads=1, head_dim=16, block_counts=2)
