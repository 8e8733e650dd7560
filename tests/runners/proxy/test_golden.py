"""Golden loss curves of the proxy trainer on CPU: a plain (tiny_noloop), a looped
(tiny_mixerloop) and an elastic (tiny_elr, late switch at step 15 of 20) run. Each asset
records its config and the torch version it was made with; a mismatch under another torch
version says so.

Regenerate after an intended change to the model or the trainer:
``python tests/runners/proxy/test_golden.py --regen``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from runners.train import TrainConfig, train

from helpers import TESTS, arch

ASSETS = TESTS / "assets"
BASE = dict(task="mqar", task_params={"vocab_size": 32, "seq_len": 32, "num_kv_pairs": 4}, batch_size=8,
            lr=3e-3, min_lr=3e-4, eval_batches=2, seed=0, progress=False)
CONFIGS = {
    "tiny_noloop": {**BASE, "steps": 25, "warmup_steps": 5, "eval_every": 25},
    "tiny_mixerloop": {**BASE, "steps": 20, "warmup_steps": 4, "eval_every": 20},
    "tiny_elr": {**BASE, "steps": 20, "warmup_steps": 4, "eval_every": 20},
}

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: identical sums run to run


def asset(name: str) -> Path:
    return ASSETS / f"golden_{name}_mqar.json"


def run(name: str):
    return train(arch(name), TrainConfig(**CONFIGS[name]))


@pytest.mark.parametrize("name", CONFIGS)
def test_golden_loss_curve(name):
    golden = json.loads(asset(name).read_text())
    assert golden["config"] == CONFIGS[name]
    result = run(name)
    same = golden["torch"] == torch.__version__
    note = "" if same else (f" (asset made with torch {golden['torch']}, running {torch.__version__}: "
                            "regenerate it if the difference is torch's)")
    assert result.status == "ok"
    assert len(result.losses) == len(golden["losses"]) == CONFIGS[name]["steps"]
    assert result.losses == pytest.approx(golden["losses"], rel=1e-4, abs=1e-5), "loss curve moved" + note
    assert result.final["eval_loss"] == pytest.approx(golden["eval_loss"], rel=1e-4), note
    assert result.depth_rows == golden["depth_rows"], "loop counts drawn differently" + note
    assert [p.quality for p in result.elastic] == pytest.approx(golden["elastic"], rel=1e-4), note
    # the curve goes down: the asset is not a flat line that any model would match
    assert golden["losses"][-1] < golden["losses"][0] - 0.1


def regen() -> None:
    torch.set_num_threads(1)
    for name in CONFIGS:
        result = run(name)
        asset(name).write_text(json.dumps({
            "spec": name, "config": CONFIGS[name], "torch": torch.__version__, "losses": result.losses,
            "eval_loss": result.final["eval_loss"], "depth_rows": result.depth_rows,
            "elastic": [p.quality for p in result.elastic]}, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regen"]:
        sys.exit("usage: python tests/runners/proxy/test_golden.py --regen")
    regen()
