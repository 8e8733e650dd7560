"""benchmarks/gpu_runbook.sh --smoke: the runbook a session lent a GPU runs, on CPU, so it
cannot rot unseen. gpu_check is skipped here: tests/project/test_benchmark_scripts.py runs
gpu_check.py --smoke itself (two minutes under Triton's interpreter), and running it twice
would double that in CI; every other step runs as on the GPU, in its smoke size."""
import json
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
SCRIPT = ROOT / "benchmarks" / "gpu_runbook.sh"


@pytest.mark.slow
def test_runbook_smoke_runs_every_step_on_cpu(tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), "--smoke", "--skip", "gpu_check", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    summary = json.loads((tmp_path / "gpu_runbook.json").read_text())
    assert summary["smoke"] is True
    assert {s["step"]: s["result"] for s in summary["steps"]} == {
        "doctor": "ok", "gpu_check": "skipped", "sweep": "ok", "bench": "ok"}
    assert "| sweep | ok |" in (tmp_path / "gpu_runbook.md").read_text()
    assert json.loads((tmp_path / "doctor.json").read_text())["cuda_available"] is False
    sweep = json.loads((tmp_path / "gpu_sweep.json").read_text())
    # the trials asked for a quarter GPU each, found none, trained on CPU, and said so once
    assert [t["status"] for t in sweep["trials"]] == ["complete", "complete"]
    assert all(t["devices"] == ["cpu"] and t["ran_on"] == ["cpu"] for t in sweep["trials"])
    assert sweep["devices"] == {"cpu": 2}
    assert (tmp_path / "sweep.log").read_text().count("train on CPU") == 1
    bench = json.loads((tmp_path / "bench_mixerloop_110m.json").read_text())
    assert bench["spec"] == "tiny_mixerloop" and bench["rows"]


def test_runbook_refuses_an_unknown_step(tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), "--smoke", "--skip", "gpu_chek", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and "no step gpu_chek" in run.stderr
