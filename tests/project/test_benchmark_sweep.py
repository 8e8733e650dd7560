"""benchmarks/bench_sweep.py --quick runs its three sections end to end (optuna backend only).

Only the shape is checked (three sections, finite numbers): the timing and saving targets
are the benchmark's claims, measured by its full run, not test thresholds."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
pytestmark = pytest.mark.slow  # the benchmark's three sections, end to end


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_bench_sweep_quick(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_sweep.py"), "--quick", "--backends", "optuna",
         "--results", str(tmp_path), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for header in ("1. Scheduling overhead", "2. Early stopping", "3. Rank agreement per rung"):
        assert header in out, out
    res = json.loads((tmp_path / "bench_sweep_quick.json").read_text())
    md = (tmp_path / "bench_sweep_quick.md").read_text()
    assert "## 1. Scheduling overhead" in md and "## 2. Early stopping" in md and "## 3. Rank agreement" in md
    assert "Command:" in md and "python benchmarks/bench_sweep.py --quick" in md

    [optuna] = res["overhead"]["backends"]
    assert optuna["engine"] == "optuna" and optuna["complete"] == res["overhead"]["trials"] == 4
    assert all(_finite(optuna[k]) and optuna[k] > 0 for k in ("ratio", "sweep_wall_s", "ideal_s"))

    es = res["early_stopping"]
    assert es["candidates"] == 4 and es["status_full"] == {"complete": 4}
    assert _finite(es["saving"]) and 0.0 <= es["saving"] < 1.0
    assert _finite(es["recall"]) and 0.0 <= es["recall"] <= 1.0 and es["front_full"]

    rows = res["rank_agreement"]
    assert [r["step"] for r in rows] == [10, 20, 30] and [r["es_rung"] for r in rows] == [True, True, False]
    assert all(_finite(r["tau"]) and -1.0 <= r["tau"] <= 1.0 for r in rows)


