"""Issue #34, the last three gaps: a run's folder, a checkpoint's size, a journal's line.

- A symlink at a run folder (``trials/<id>/``, or ``trials/<id>/s<i>/`` of a seeded
  replicate) inside a real ``trials/``: the trainer made the folder and wrote its checkpoint
  and result through it. A resume that would continue a run there is one line (the link and
  its target untouched); a run that starts afresh replaces the link (its target untouched).
- A checkpoint larger than its model can make (:func:`runners.checkpoint.checkpoint_cap`:
  16 bytes a parameter plus a fixed allowance) is refused in one line before it is read.
- A journal line longer than any entry a study writes (a 2 GB line with no newline) is
  never read whole: one line, the journal left as it was.

The hostile file is made in each test; a refusal is one line, exit 2, no traceback, within
the CPU and memory bounds of ``test_hostile_dirs.bounded`` (peak memory from VmHWM).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import one_line
from test_hostile_dirs import bounded
from test_hostile_links import planted
from test_hostile_round2 import tree, yaml_space

from nas.load import load_arch
from nas.space import load_space
from runners.checkpoint import (
    ALLOWANCE, BYTES_PER_PARAM, CHECKPOINT, MAX_CHECKPOINT, CheckpointError, LinkError, checkpoint_cap, load,
    run_folder,
)
from runners.sweep.driver import Sweep, SweepError
from runners.results.records import JOURNAL, MAX_ENTRY, TRIALS, RecordError, read_trials, repair_journal
from spaces import arch_path


def swept(space: Path, exp: Path) -> None:
    """A sweep that trains (not a refusal: no bounds but the wall clock)."""
    proc = subprocess.run([sys.executable, "-m", "runners", "sweep", str(space), "--out", str(exp)],
                          capture_output=True, text=True, timeout=300, cwd=space.parent)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def interrupted(tmp_path: Path, seeds: int = 1) -> tuple[Path, Path, str]:
    """An experiment whose first trial was given to a worker and then left running (the
    driver killed): its space, its directory and the trial's id."""
    space, exp = yaml_space(tmp_path), tmp_path / "exp"
    sweep = Sweep(load_space(space), exp, "optuna", seeds=seeds)
    job = sweep.next_job()
    sweep.close()
    [record] = read_trials(exp)
    assert record.status == "running" and record.id == job.trial
    return space, exp, job.trial


# ---------------------------------------------------------------- 1. a run's folder


def test_a_resume_into_a_symlinked_run_folder_is_one_line(tmp_path):
    precious, folder, _ = planted(tmp_path)
    space, exp, rid = interrupted(tmp_path)
    run = exp / TRIALS / rid
    if run.exists():
        os.rename(run, tmp_path / "moved")  # "moved to another disk"
    run.symlink_to(folder, target_is_directory=True)
    before = tree(folder), precious.read_text()
    one_line(*bounded("sweep", space, "--out", exp, "--resume", cwd=tmp_path),
             f"--resume: {run} is a symbolic link (to {folder})", "start a new experiment with another --out")
    assert (tree(folder), precious.read_text()) == before and run.is_symlink()


def test_a_resume_into_a_symlinked_replicate_folder_is_one_line(tmp_path):
    precious, folder, _ = planted(tmp_path)
    space, exp, rid = interrupted(tmp_path, seeds=2)
    (exp / TRIALS / rid).mkdir(exist_ok=True)
    replicate = exp / TRIALS / rid / "s1"  # the replicate not yet given out: resumed too
    replicate.symlink_to(folder, target_is_directory=True)
    before = tree(folder), precious.read_text()
    one_line(*bounded("sweep", space, "--out", exp, "--resume", "--seeds", "2", cwd=tmp_path),
             f"--resume: {replicate} is a symbolic link")
    assert (tree(folder), precious.read_text()) == before and replicate.is_symlink()


def test_a_link_planted_while_a_resume_runs_is_refused_where_the_job_is_made(tmp_path):
    _, folder, _ = planted(tmp_path)
    space, exp, rid = interrupted(tmp_path)
    sweep = Sweep(load_space(space), exp, "optuna", resume=True)
    try:
        (exp / TRIALS / rid).symlink_to(folder, target_is_directory=True)
        with pytest.raises(SweepError, match="is a symbolic link"):
            sweep.next_job()
    finally:
        sweep.close()
    assert tree(folder) == ["notes.txt"]


def test_a_new_run_replaces_a_planted_link_and_writes_through_none(tmp_path):
    """A real trials/ the user made, with a link at the first trial's folder: the sweep
    trains there, in a folder of its own; the link's target is untouched."""
    precious, folder, exp = planted(tmp_path)
    space = yaml_space(tmp_path, extra="search: {sampler: random, trials: 1, concurrency: 1}")
    (exp / TRIALS).mkdir()
    run = exp / TRIALS / "t0000"
    run.symlink_to(folder, target_is_directory=True)
    swept(space, exp)
    assert tree(folder) == ["notes.txt"] and precious.read_text() == "precious"
    assert not run.is_symlink() and (run / CHECKPOINT).is_file()
    assert [r.status for r in read_trials(exp)] == ["complete"]


def test_run_folder_replaces_each_link_on_the_way_or_refuses_it(tmp_path):
    _, folder, exp = planted(tmp_path)
    top = exp / TRIALS
    top.mkdir()
    (top / "t0001").symlink_to(folder, target_is_directory=True)
    with pytest.raises(LinkError, match="t0001 is a symbolic link"):
        run_folder(top, top / "t0001" / "s0", resume=True)
    assert (top / "t0001").is_symlink()
    assert run_folder(top, top / "t0001" / "s0") == top / "t0001" / "s0"
    assert not os.path.lexists(top / "t0001") and tree(folder) == ["notes.txt"]


# ---------------------------------------------------------------- 2. a checkpoint's size


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk (a hole): what matters is that it is never read."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_the_cap_is_proportional_to_the_model():
    tiny, big = load_arch(arch_path("tiny_noloop")), load_arch(arch_path("noloop_110m"))
    from nas.cost.sheet import unique_params

    assert checkpoint_cap(tiny) == BYTES_PER_PARAM * unique_params(tiny) + ALLOWANCE
    assert checkpoint_cap(big) == BYTES_PER_PARAM * unique_params(big) + ALLOWANCE
    assert checkpoint_cap(tiny, copies=3) - ALLOWANCE == 3 * (checkpoint_cap(tiny) - ALLOWANCE)
    # a checkpoint trained on a task's vocabulary (an export does not know it): room for 2^18 tokens
    assert checkpoint_cap(tiny) < checkpoint_cap(tiny, any_vocab=True) < MAX_CHECKPOINT


def test_a_trainer_checkpoint_fits_its_models_cap_without_the_allowance(tmp_path):
    from nas.cost.sheet import unique_params
    from runners.train import TrainConfig, train

    arch = load_arch(arch_path("tiny_noloop"))
    config = TrainConfig(task="s5", task_params={"seq_len": 4, "degree": 2}, steps=4, batch_size=4, eval_every=2,
                         checkpoint_every=2)
    result = train(arch, config, out_dir=tmp_path / "run")
    size = (tmp_path / "run" / CHECKPOINT).stat().st_size
    ckpt = load(tmp_path / "run" / CHECKPOINT, cap=checkpoint_cap(result.arch))
    params = sum(t.numel() for t in ckpt["model"].values())
    assert params == unique_params(result.arch)  # the cost model counts what the trainer saves
    assert size <= BYTES_PER_PARAM * params + (1 << 20), size  # weights and AdamW's moments: 12 bytes each


def test_a_checkpoint_larger_than_its_model_is_refused_before_it_is_read(tmp_path):
    arch = load_arch(arch_path("tiny_noloop"))
    cap = checkpoint_cap(arch)
    path = sparse(tmp_path / CHECKPOINT, cap + 1)
    with pytest.raises(CheckpointError, match="not read"):
        load(path, cap=cap)
    with pytest.raises(CheckpointError, match="more than a checkpoint of any model"):
        load(sparse(tmp_path / "huge.pt", MAX_CHECKPOINT + 1))


def test_export_with_an_oversized_checkpoint_is_one_line(tmp_path):
    arch = load_arch(arch_path("tiny_noloop"))
    path = sparse(tmp_path / CHECKPOINT, checkpoint_cap(arch, any_vocab=True) + 1)
    out = tmp_path / "exported"
    one_line(*bounded("export", "tiny_noloop", "--checkpoint", path, "--out", out, cwd=tmp_path),
             f"{path}:", "not read")
    assert not out.exists()


def test_export_with_weights_of_a_trial_whose_checkpoint_is_oversized_is_one_line(tmp_path):
    space, exp = yaml_space(tmp_path, extra="search: {sampler: random, trials: 1, concurrency: 1}"), tmp_path / "exp"
    swept(space, exp)
    [record] = read_trials(exp)
    ckpt = exp / TRIALS / record.id / CHECKPOINT
    sparse(ckpt, 4 << 30)  # the trial's checkpoint overwritten by 4 GB the model cannot have made
    out = tmp_path / "exported"
    one_line(*bounded("export", exp, "--trial", record.id, "--with-weights", "--out", out, cwd=tmp_path),
             f"{ckpt}:", "not read")
    assert not out.exists()


# ---------------------------------------------------------------- 3. a journal's line


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_journal_line_longer_than_any_entry_is_one_line_and_not_read_whole(tmp_path, where):
    space, exp = yaml_space(tmp_path, extra="search: {sampler: random, trials: 1, concurrency: 1}"), tmp_path / "exp"
    sweep = Sweep(load_space(space), exp, "optuna")
    sweep.close()
    journal = exp / JOURNAL
    whole = journal.read_bytes()
    assert whole.endswith(b"\n")
    with open(journal, "ab") as f:  # 2 GB with no newline: a hole, never written to disk
        f.truncate(len(whole) + (2 << 30))
    if where == "middle":
        with open(journal, "ab") as f:
            f.write(b"\n" + whole.splitlines(keepends=True)[0])
    size = journal.stat().st_size
    entry = len(whole.splitlines()) + 1
    one_line(*bounded("sweep", space, "--out", exp, "--resume", cwd=tmp_path),
             f"{journal}: entry {entry} (byte {len(whole)}) is longer than {MAX_ENTRY >> 20} MB",
             "restore the file")
    assert journal.stat().st_size == size  # nothing cut: it is not a write cut short
    with pytest.raises(RecordError, match="longer than"):
        repair_journal(journal)


def test_a_torn_last_entry_within_the_cap_is_still_cut(tmp_path):
    journal = tmp_path / JOURNAL
    journal.write_bytes(b'{"op_code": 0}\n{"op_co')
    assert repair_journal(journal) == 7 and journal.read_bytes() == b'{"op_code": 0}\n'
