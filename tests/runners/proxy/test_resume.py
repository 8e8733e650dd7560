"""``loopnas train --resume DIR`` continues an interrupted run from the spec and config
saved with its checkpoint, and may extend it to more steps."""
import json

import pytest

from runners.cli import main
from runners.train import TrainConfig, train
from nas import load_arch
from spaces import arch_path

TASK = ["--set", "task.vocab_size=16", "--set", "task.seq_len=16", "--set", "task.num_kv_pairs=2",
        "--set", "batch_size=4", "--set", "eval_every=2", "--set", "eval_batches=1",
        "--set", "progress=false"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread


def test_a_checkpoint_may_be_extended_to_more_steps(tmp_path):
    """The fingerprint once held the step budget, so a longer schedule was refused."""
    spec = load_arch(arch_path("tiny_mixerloop"))
    cfg = TrainConfig(task="mqar", task_params={"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2},
                      steps=4, batch_size=4, eval_every=2, eval_batches=1, checkpoint_every=2,
                      progress=False)
    first = train(spec, cfg, out_dir=tmp_path)
    longer = train(spec, cfg.model_copy(update={"steps": 6}), out_dir=tmp_path,
                   resume=tmp_path / "checkpoint.pt")
    assert first.steps == 4 and longer.steps == 6
    assert longer.losses[:4] == first.losses and len(longer.losses) == 6


def test_cli_resume_extends_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "tiny_noloop", "--task", "mqar", "--steps", "4", "--out", str(run),
                 "--json", *TASK]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["train", "--resume", str(run), "--steps", "6", "--json"]) == 0
    extended = json.loads(capsys.readouterr().out)
    assert extended["steps"] == 6 and extended["losses"][:4] == first["losses"]
    assert json.loads((run / "result.json").read_text())["steps"] == 6


def test_cli_resume_errors_are_one_line(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no checkpoint.pt to resume" in capsys.readouterr().err
    assert main(["train", "tiny_noloop"]) == 2
    assert "give SPEC and --task" in capsys.readouterr().err
