"""The GPU check script runs its whole code path on CPU (--smoke), so it cannot rot unseen.

Its op check compares two code paths, fla's Triton kernels (under Triton's interpreter)
and the torch twins, so it fails when they disagree: a sign flipped in either gives a
relative error near 2.
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["smoke"] is True and "--smoke" in result["command"]
    assert {r["op"] for r in result["ops"]} >= {"gdn", "deltanet", "kda", "mamba2", "attn", "nsa", "swiglu"}
    errors = [r for r in result["ops"] if "error" in r]
    assert not errors, errors
    for r in result["ops"]:
        assert r["fla_class"].startswith("Fla"), r  # fla's layer, not the torch fallback
        assert r["out_rel_err"] < 1e-5 and r["grad_rel_err"] < 1e-5, r
    assert [r["spec"] for r in result["throughput"]] == ["tiny_noloop", "tiny_fullloop", "tiny_mixerloop"]
    assert all(r["tokens_per_s"] > 0 for r in result["throughput"])
