"""The GPU check script runs its whole code path on CPU (--smoke), so it cannot rot unseen.

Its op check compares two code paths, fla's Triton kernels (under Triton's interpreter)
and the torch twins, so it fails when they disagree: a sign flipped in either gives a
relative error near 2.

The serving benchmarks (decode GDN vs attention, last-loop vs per-loop KV, MixerLoop vs
FullLoop prefill) and the GPU serving script run their whole code path in a --smoke mode:
the byte counts are checked exactly, the timings only for being measured (no speed order
is asserted here: timing claims belong to the benchmarks' own runs).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

ROOT = REPO


@pytest.mark.slow
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


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--smoke", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _rows(markdown: str) -> list[list[str]]:
    lines = [l for l in markdown.splitlines() if l.startswith("| ") and not l.startswith("|---")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines[1:]]


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_serving_kv_script_measures_last_loop_kv_flat_per_loop_growing():
    rows = _rows(_script("bench_serving_kv.py").stdout)
    kv = {(r[0], int(r[1])): _num(r[2]) for r in rows}
    assert all(r[-1] == "yes" for r in rows)  # measured bytes equal the cost model's
    assert [kv["per_loop", k] / kv["per_loop", 1] for k in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert {kv["last_loop", k] for k in (1, 2, 3, 4)} == {kv["per_loop", 1]}


@pytest.mark.parametrize("script, ratio_col", [("bench_serving_decode.py", 4), ("bench_serving_prefill.py", 5)])
def test_serving_timing_scripts_print_ratios(script, ratio_col):
    rows = _rows(_script(script).stdout)
    assert [int(r[1]) for r in rows] == [32, 64]
    assert all(_num(r[ratio_col]) > 0 for r in rows)  # a ratio measured in the run; no order asserted


def test_gpu_serving_smoke(tmp_path):
    out = tmp_path / "gpu_serving.json"
    _script("gpu_serving.py", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["smoke"] is True and "--smoke" in result["command"]
    for section in ("decode", "kv", "prefill"):
        assert result[section] and not [r for r in result[section] if "error" in r or "skipped" in r], section
    assert all(r["gdn_over_attn"] > 0 and r["attn_kv_bytes"] > 0 == r["gdn_kv_bytes"] for r in result["decode"])
    kv = {(r["kv_policy"], r["k"]): r for r in result["kv"]}
    assert all(r["kv_bytes"] == r["cost_kv_bytes"] and r["peak_memory_bytes"] > 0 for r in kv.values())
    assert kv["per_loop", 4]["kv_bytes"] == 4 * kv["last_loop", 4]["kv_bytes"] == 4 * kv["per_loop", 1]["kv_bytes"]
    assert all(r["forward_mixerloop_over_fullloop"] > 0 and r["prefill_mixerloop_over_fullloop"] > 0
               for r in result["prefill"])
