"""Checkpoints never run code: every command that opens one loads weights only, and a
crafted, torn or foreign file is one line and exit code 2 (``runners.checkpoint``)."""
import json
import pathlib
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from nas import load_arch
from runners import checkpoint
from runners.cli import main
from runners.weights import load_source
from runners.train import TrainConfig, train
from spaces import arch_path

TASK = {"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2}
SETS = [f"--set=task.{k}={v}" for k, v in TASK.items()] + [
    "--set=batch_size=4", "--set=eval_every=2", "--set=eval_batches=1", "--set=progress=false"]

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread


class Touch:
    """Unpickling this calls ``Path.touch(marker)``: code run by merely loading the file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    """A real trainer output dir: four steps of tiny_noloop on MQAR."""
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(task="mqar", task_params=TASK, steps=4, batch_size=4, eval_every=2,
                      eval_batches=1, checkpoint_every=2, progress=False)
    train(load_arch(arch_path("tiny_noloop")), cfg, out_dir=out)
    return out


def crafted(folder: pathlib.Path, run: pathlib.Path, how: str) -> pathlib.Path:
    """A checkpoint.pt shaped like ``run``'s (same keys, same weights) that also holds a
    ``Touch``: written by torch.save (a zip archive), or pickled at protocol 2 (torch's
    legacy format) or 5 (which the weights-only unpickler cannot even read)."""
    folder.mkdir()
    ckpt = checkpoint.load(run / checkpoint.CHECKPOINT)
    ckpt["extra"] = Touch(folder / "MARKER")
    path = folder / checkpoint.CHECKPOINT
    if how == "zip":
        torch.save(ckpt, path)
    else:
        path.write_bytes(pickle.dumps(ckpt, protocol=int(how.removeprefix("pickle"))))
    return path


def torn(folder: pathlib.Path, run: pathlib.Path) -> pathlib.Path:
    folder.mkdir()
    data = (run / checkpoint.CHECKPOINT).read_bytes()
    (folder / checkpoint.CHECKPOINT).write_bytes(data[: len(data) // 2])
    return folder / checkpoint.CHECKPOINT


def foreign(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir()
    (folder / checkpoint.CHECKPOINT).write_text("these are my notes, not a checkpoint\n")
    return folder / checkpoint.CHECKPOINT


def commands(path: pathlib.Path, out: pathlib.Path) -> dict[str, list[str]]:
    return {
        "diagnose": ["diagnose", str(path.parent), "--out", str(out)],
        "init-from": ["train", "tiny_noloop", "--task", "mqar", "--steps", "2",
                      "--init-from", str(path), *SETS],
        "resume": ["train", "--resume", str(path.parent)],
        "export": ["export", "tiny_noloop", "--checkpoint", str(path), "--out", str(out)],
    }


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_the_crafted_file_really_runs_code_when_unpickled(run, tmp_path):
    """The fixture is live: a plain unpickler creates the marker."""
    path = crafted(tmp_path / "evil", run, "pickle2")
    pickle.loads(path.read_bytes())
    assert (tmp_path / "evil" / "MARKER").exists()


@pytest.mark.parametrize("command", ["diagnose", "init-from", "resume", "export"])
@pytest.mark.parametrize("how", ["zip", "pickle2"])
def test_a_checkpoint_that_would_run_code_is_refused(run, tmp_path, capsys, command, how):
    path = crafted(tmp_path / "evil", run, how)
    assert main(commands(path, tmp_path / "out")[command]) == 2
    line = one_error_line(capsys)
    assert f"{path}: refused" in line and "would run code" in line
    assert not (tmp_path / "evil" / "MARKER").exists()


@pytest.mark.parametrize("command", ["diagnose", "init-from", "resume", "export"])
@pytest.mark.parametrize("kind", ["torn", "foreign", "pickle5"])
def test_a_torn_or_foreign_file_is_one_line(run, tmp_path, capsys, command, kind):
    folder = tmp_path / kind
    path = {"torn": lambda: torn(folder, run), "foreign": lambda: foreign(folder),
            "pickle5": lambda: crafted(folder, run, "pickle5")}[kind]()
    assert main(commands(path, tmp_path / "out")[command]) == 2
    assert f"{path}: not a readable checkpoint" in one_error_line(capsys)
    assert not (folder / "MARKER").exists()


def test_the_installed_command_prints_no_traceback(run, tmp_path):
    path = crafted(tmp_path / "evil", run, "zip")
    loopnas = pathlib.Path(sys.executable).parent / "loopnas"
    proc = subprocess.run([str(loopnas), *commands(path, tmp_path / "d")["diagnose"]],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: refused: this checkpoint holds Python objects that would run code when "
        "loaded (loopnas loads weights only)"]
    assert not (tmp_path / "evil" / "MARKER").exists()


def test_a_real_checkpoint_still_resumes(run, tmp_path, capsys):
    again = tmp_path / "run"
    shutil.copytree(run, again)
    assert main(["train", "--resume", str(again), "--steps", "6", "--json"]) == 0
    extended = json.loads(capsys.readouterr().out)
    first = json.loads((run / checkpoint.RESULT).read_text())
    assert extended["steps"] == 6 and extended["losses"][:4] == first["losses"]


def test_a_real_checkpoint_still_initialises_a_run(run, capsys):
    arch, state = load_source(run / checkpoint.CHECKPOINT)
    assert arch.name == "tiny_noloop" and state["embed.weight"].shape[0] == TASK["vocab_size"]
    assert main(["train", "tiny_noloop", "--task", "mqar", "--steps", "2", "--json",
                 "--init-from", str(run / checkpoint.CHECKPOINT), *SETS]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2


def test_save_writes_plain_data_only(tmp_path):
    path = tmp_path / "c.pt"
    checkpoint.save(path, {"acc": np.float64(0.5), "config": TrainConfig(task="mqar", steps=1),
                           "w": torch.ones(2), "rows": (np.int64(3), 4)})
    ckpt = checkpoint.load(path)
    assert ckpt["acc"] == 0.5 and type(ckpt["acc"]) is float
    assert ckpt["config"]["task"] == "mqar" and ckpt["rows"] == (3, 4)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # the temporary was renamed
    with pytest.raises(TypeError, match="checkpoint field checkpoint.f: builtin_function"):
        checkpoint.save(tmp_path / "d.pt", {"f": len})
    assert not (tmp_path / "d.pt").exists()


def test_a_missing_file_or_a_non_dict_is_a_checkpoint_error(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no such checkpoint file"):
        checkpoint.load(tmp_path / "missing.pt")
    torch.save(torch.ones(2), tmp_path / "t.pt")
    with pytest.raises(checkpoint.CheckpointError, match="holds a Tensor"):
        checkpoint.load(tmp_path / "t.pt")
