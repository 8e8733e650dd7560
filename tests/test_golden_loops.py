"""Golden loss curves of a looped (tiny_mixerloop) and an elastic (tiny_elr, late switch
at step 15 of 20) proxy run on CPU. Each asset records the torch version it was made with;
a mismatch under another version says so.

Regenerate after an intended change: ``python tests/test_golden_loops.py --regen``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from nas import load_arch
from runners.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(__file__).parent / "assets"
TASK = {"vocab_size": 32, "seq_len": 32, "num_kv_pairs": 4}
CONFIG = dict(task="mqar", task_params=TASK, steps=20, batch_size=8, lr=3e-3, min_lr=3e-4,
              warmup_steps=4, eval_every=20, eval_batches=2, seed=0, progress=False)
SPECS = ("tiny_mixerloop", "tiny_elr")


def asset(name: str) -> Path:
    return ASSETS / f"golden_{name}_mqar.json"


def run(name: str):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # identical sums run to run
    try:
        return train(load_arch(ROOT / "spaces" / "archs" / f"{name}.yaml"), TrainConfig(**CONFIG))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", SPECS)
def test_golden_loss_curve(name):
    golden = json.loads(asset(name).read_text())
    assert golden["config"] == CONFIG
    result = run(name)
    same = golden["torch"] == torch.__version__
    note = "" if same else (f" (asset made with torch {golden['torch']}, running {torch.__version__}: "
                            "regenerate it if the difference is torch's)")
    assert result.losses == pytest.approx(golden["losses"], rel=1e-4, abs=1e-5), "loss curve moved" + note
    assert result.depth_rows == golden["depth_rows"], "loop counts drawn differently" + note
    assert [p.quality for p in result.elastic] == pytest.approx(golden["elastic"], rel=1e-4), note
    assert golden["losses"][-1] < golden["losses"][0]


def regen() -> None:
    for name in SPECS:
        result = run(name)
        asset(name).write_text(json.dumps({
            "spec": name, "config": CONFIG, "torch": torch.__version__, "losses": result.losses,
            "depth_rows": result.depth_rows, "elastic": [p.quality for p in result.elastic]},
            indent=1) + "\n")


if __name__ == "__main__" and "--regen" in sys.argv:
    regen()
