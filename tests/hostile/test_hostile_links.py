"""Issue #34, the classes' siblings: every write under an experiment or output directory
never follows a link, and every file read there is read bounded (regular files only).

- the sweep's own non-atomic writes: the driver's lock file, the copy of the space, the trial
  records' folder, the artifact store, the study's journal (appended to by Optuna);
- a resume of an experiment holding a symlink where it appends refuses in one line;
- a FIFO, a device or an oversized file where export, the one-shot self-check, a transfer or
  a remedied supernet reads one is no export / no summary / one warning, never a hang.

The hostile file is made in each test; a refusal is one line, exit 2, no traceback, within
the CPU and memory bounds of ``test_hostile_dirs.bounded``.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from helpers import one_line
from test_hostile_dirs import bounded
from test_hostile_round2 import tree, yaml_space

from nas.space import load_space
from runners.sweep.driver import APPENDED, Sweep, SweepError
from runners.sweep.lock import LOCK
from runners.results.records import JOURNAL, MAX_RECORD, RecordError, TRIALS


def planted(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A precious file and a folder of the user's, outside the experiment ``exp``."""
    precious, folder, exp = tmp_path / "thesis.tex", tmp_path / "mine", tmp_path / "exp"
    precious.write_text("precious")
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    exp.mkdir()
    return precious, folder, exp


# ---------------------------------------------------------------- the sweep's own writes


def test_a_new_sweep_replaces_every_planted_link_and_writes_through_none(tmp_path):
    """driver.lock was opened O_RDWR through a link (the driver's note over the user's file);
    space.yaml was copied through one; trials/ and artifacts/ sent records outside."""
    precious, folder, exp = planted(tmp_path)
    (exp / LOCK).symlink_to(precious)
    (exp / "space.yaml").symlink_to(precious)
    (exp / JOURNAL).symlink_to(precious)
    for name in (TRIALS, "artifacts", "tensorboard"):
        (exp / name).symlink_to(folder, target_is_directory=True)
    Sweep(load_space(yaml_space(tmp_path)), exp, "optuna").close()
    assert precious.read_text() == "precious" and tree(folder) == ["notes.txt"]
    for name in (LOCK, "space.yaml", TRIALS):
        assert not (exp / name).is_symlink(), name
    assert (exp / "space.yaml").read_text() == yaml_space(tmp_path).read_text()


@pytest.mark.parametrize("name", [JOURNAL, TRIALS, "artifacts"])
def test_a_resume_through_a_planted_link_is_one_line(tmp_path, name):
    precious, folder, exp = planted(tmp_path)
    space = yaml_space(tmp_path)
    Sweep(load_space(space), exp, "optuna").close()
    target = folder if name != JOURNAL else precious
    if os.path.lexists(exp / name):
        os.rename(exp / name, tmp_path / f"moved-{name}")  # the user "moved it to another disk"
    (exp / name).symlink_to(target, target_is_directory=target.is_dir())
    before = tree(folder), precious.read_text()
    one_line(*bounded("sweep", space, "--out", exp, "--resume", cwd=tmp_path),
             f"--resume: {exp / name} is a symbolic link", "start a new experiment with another --out")
    assert (tree(folder), precious.read_text()) == before and (exp / name).is_symlink()


def test_every_appended_name_is_checked():
    assert {JOURNAL, TRIALS, "artifacts", "tensorboard", "supernet", "check"} <= set(APPENDED)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_journal_that_is_not_a_file_is_one_line_not_a_hang(tmp_path, kind):
    """Optuna blocks opening a FIFO for reading and reads a device for ever."""
    space, exp = yaml_space(tmp_path), tmp_path / "exp"
    Sweep(load_space(space), exp, "optuna").close()
    (exp / JOURNAL).unlink()
    if kind == "fifo":
        os.mkfifo(exp / JOURNAL)
        needle = "is a FIFO, not the study's journal file"
    else:  # a link to a device: refused as a link before it is ever opened
        (exp / JOURNAL).symlink_to("/dev/zero")
        needle = "is a symbolic link"
    one_line(*bounded("sweep", space, "--out", exp, "--resume", cwd=tmp_path), str(exp / JOURNAL), needle)
    with pytest.raises((RecordError, SweepError), match="FIFO|symbolic link"):
        Sweep(load_space(space), exp, "optuna", resume=True)


# ---------------------------------------------------------------- export's --out


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["config.json", "loopnas_export.json"])
def test_export_into_a_directory_with_a_hostile_config_or_manifest_is_one_line(tmp_path, kind, name):
    """A FIFO named config.json in --out hung export; a link to /dev/zero there ended in
    MemoryError (both read whole to ask whether the directory holds an export)."""
    out = tmp_path / "out"
    out.mkdir()
    if kind == "fifo":
        os.mkfifo(out / name)
    else:
        (out / name).symlink_to("/dev/zero")
    one_line(*bounded("export", "tiny_noloop", "--out", out, cwd=tmp_path),
             f"--out {out} is not empty and holds no loopnas export")
    assert sorted(p.name for p in out.iterdir()) == [name]


# ---------------------------------------------------------------- bounded reads of the rest


def hostile(path: Path, kind: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:  # oversized: past every cap these readers use
        path.write_bytes(b"{" + b" " * (MAX_RECORD + 1))
    return path


KINDS = ["fifo", "dev-zero", "oversized"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_one_shot_summary_the_self_check_reads_is_bounded(tmp_path, kind):
    from runners.oneshot.check import _summary
    assert _summary(hostile(tmp_path / "oneshot.json", kind)) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_remedied_supernets_result_is_bounded(tmp_path, kind, caplog):
    from runners.oneshot.remedies import _result
    with caplog.at_level(logging.WARNING, "loopnas.records"):
        assert _result(hostile(tmp_path / "result.json", kind)) is None
    assert len(caplog.records) == 1 and "trained again" in caplog.records[0].getMessage()


@pytest.mark.parametrize("kind", KINDS)
def test_an_experiments_transfer_is_read_bounded(tmp_path, kind, caplog):
    from runners.transfer.run import find
    hostile(tmp_path / "transfer" / "transfer.json", kind)
    with caplog.at_level(logging.WARNING, "loopnas.records"):
        assert find(tmp_path) is None
    assert len(caplog.records) == 1 and "unreadable" in caplog.records[0].getMessage()


# ---------------------------------------------------------------- calibrate's --address


@pytest.mark.parametrize("address, why", [("http://127.0.0.1:8265", "a URL is not a Ray address"),
                                          ("", "--address is empty"), ("closed", "connection refused")],
                         ids=["url", "empty", "closed"])
def test_calibrate_on_a_bad_ray_address_is_one_line_and_leaves_nothing(tmp_path, address, why):
    """The issue's ``calibrate --address http://…`` gave ray.init's traceback. Loopback only."""
    import socket

    if address == "closed":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        s.close()
    out = tmp_path / "deep" / "cal"
    one_line(*bounded("calibrate", yaml_space(tmp_path), "--engine", "ray", "--address", address, "--out", out,
                      cwd=tmp_path), f"--address {address}".rstrip() if address else "--address", why,
             "ray start --head")
    assert not (tmp_path / "deep").exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- status's index


@pytest.mark.parametrize("name", ["index.json", "index.more.json"])
def test_an_index_larger_than_the_records_it_digests_is_not_read(tmp_path, name):
    """EXP/index.json is a digest of the records: a planted 250 MB one (under the flat 256 MB
    cap) took status to 565 MB. It is capped by the records' own size, read again from them
    and rewritten."""
    from test_experiment_robustness import fabricated

    exp = fabricated(tmp_path / "exp")
    rc, out, _ = bounded("status", exp, "--json")
    assert rc == 0
    good = json.loads(out)
    (exp / name).write_bytes(b'{"format":2,"trials":{"t0000.json":"' + b"a" * (250 << 20) + b'"}}')
    rc, out, err = bounded("status", exp, "--json")
    assert rc == 0 and json.loads(out) == good, err
    if name == "index.json":  # status reads (and so rewrites) the brief index only
        assert (exp / name).stat().st_size < 1 << 20
    from runners.results.records import read_index
    assert len(read_index(exp, more=True)) == 3  # the report's reader: capped too, read again
    assert (exp / name).stat().st_size < 1 << 20  # and rewritten from the records
