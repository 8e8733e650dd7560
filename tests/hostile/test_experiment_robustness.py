"""The experiment directory under hostile and careless use (issue #20): one driver at a time,
a killed driver does not block a resume, interrupted trials keep every rung, and a damaged
record, a torn journal, a full disk, an odd ``--out`` or an unopenable study is one line
(exit 2, no traceback) or one warning per skipped record, with nothing lost.

Full disks are real: a small tmpfs mounted for the test where the sandbox allows it (root),
and everywhere ``RLIMIT_FSIZE`` in a subprocess, whose writes past the limit fail with EFBIG.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nas.cost import cost
from nas.load import load_arch
from nas.space import load_space
from runners.cli import main
from runners.sweep.driver import Sweep, SweepError
from runners.sweep.lock import LOCK, LockError, acquire
from runners.results.records import (
    ExperimentRecord, Objective, Point, Rung, TrialRecord, read_trials, repair_journal, write_json,
)
from spaces import arch_path
from helpers import REPO, cli, one_line

OBJECTIVES = "objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]"
# every candidate breaks the constraint: the driver settles all 16 grid points itself, no training
INFEASIBLE = f"""\
name: full
base: tiny_noloop
params:
  lr: {{target: proxy.lr, choices: [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008]}}
  ffn: {{target: model.defaults.swiglu.hidden_size, choices: [64, 128]}}
constraints: ["unique_params <= 10"]
{OBJECTIVES}
proxy: {{task: s5, task_params: {{seq_len: 4, degree: 2}}, steps: 4, batch_size: 4, eval_every: 2}}
search: {{sampler: grid, trials: 16, concurrency: 1{{storage}}}}
"""
TRAINED = f"""\
name: trained
base: tiny_noloop
params:
  lr: {{target: proxy.lr, choices: [0.001, 0.002, 0.003]}}
{OBJECTIVES}
proxy: {{task: s5, task_params: {{seq_len: 8, degree: 3}}, steps: 60, batch_size: 8, eval_every: 10}}
search: {{sampler: grid, trials: {{trials}}, concurrency: 1}}
"""


def write_space(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def infeasible(tmp_path: Path, storage: str = "") -> Path:
    return write_space(tmp_path, INFEASIBLE.replace("{storage}", f", storage: {json.dumps(storage)}" if storage else ""))






def stray(root: Path) -> list[Path]:
    """Temporary files a write left behind."""
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# ---------------------------------------------------------------- a fabricated experiment


def fabricated(root: Path) -> Path:
    """An experiment directory with three complete trials of two architectures."""
    (root / "trials").mkdir(parents=True)
    objectives = [Objective(name="acc", direction="maximize", measured=True),
                  Objective(name="projection_flops", direction="minimize", measured=False)]
    write_json(root / "experiment.json", ExperimentRecord(
        name="fab", space={}, objectives=objectives, engine="optuna", trials=3, created=time.time(), seq_len=64))
    for number, (name, acc) in enumerate([("tiny_noloop", 0.4), ("tiny_mixerloop", 0.6), ("tiny_noloop", 0.5)]):
        arch = load_arch(arch_path(name))
        sheet = cost(arch, seq_len=64).to_dict()
        write_json(root / "trials" / f"t{number:04d}.json", TrialRecord(
            id=f"t{number:04d}", number=number, status="complete", arch=arch.model_dump(mode="json"),
            summary=name, cost=sheet, rungs=[Rung(step=s, quality=acc * s / 20) for s in (10, 20)],
            points=[Point(values={"acc": acc, "projection_flops": sheet["projection_flops_per_token"]})],
            started=1.0 + number, finished=2.0 + number))
    return root


DAMAGE = {
    "truncated": lambda text: text[: len(text) // 2].encode(),
    "not_utf8": lambda text: b"\xff\xfe" + text.encode("latin-1", "replace"),
    "wrong_schema": lambda text: json.dumps({"id": 7, "points": "many"}).encode(),
    "not_an_object": lambda text: b"[1, 2, 3]",
    "empty": lambda text: b"",
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_status_skips_an_unreadable_record_with_one_warning(tmp_path, capsys, damage):
    root = fabricated(tmp_path / "exp")
    bad = root / "trials" / "t0001.json"
    bad.write_bytes(DAMAGE[damage](bad.read_text()))
    rc, out, err = cli(capsys, "status", root)
    assert rc == 0 and "Traceback" not in out + err, err
    [warning] = err.strip().splitlines()
    assert warning.startswith(f"warning: {bad}: unreadable trial record") and warning.endswith("skipped")
    assert "2 complete" in out
    rc, out, err = cli(capsys, "status", root, "--json")
    data = json.loads(out)
    assert rc == 0 and data["complete"] == 2 and len(data["unreadable"]) == 1 and str(bad) in data["unreadable"][0]
    assert len(err.strip().splitlines()) == 1


def test_one_reader_serves_status_report_and_export(tmp_path):
    root = fabricated(tmp_path / "exp")
    (root / "trials" / "t0002.json").write_bytes(b"\xff")
    problems: list = []
    assert [r.id for r in read_trials(root, problems=problems)] == ["t0000", "t0001"]
    assert [p.path.name for p in problems] == ["t0002.json"] and "not UTF-8" in problems[0].why
    with pytest.raises(ValueError, match="t0002.json: unreadable trial record"):
        read_trials(root)  # without problems: the driver's strict read, one line naming the file
    from runners.export.pick import read
    from runners.report.data import load
    assert [t.id for t in read(root)[1]] == ["t0000", "t0001"]
    assert load(root).excluded == [f"t0002.json: unreadable record ({problems[0].why})"]


def test_report_and_export_skip_a_bad_record(tmp_path, capsys):
    root = fabricated(tmp_path / "exp")
    (root / "trials" / "t0000.json").write_bytes(b'{"id": "t0000", "number": 0, "status": "compl')
    rc, out, err = cli(capsys, "report", root)
    assert rc == 0 and "Traceback" not in out + err, err
    assert "left out: t0000.json: unreadable record (not JSON" in out
    assert (root / "report" / "index.html").is_file() and not stray(root)
    rc, out, err = cli(capsys, "export", root, "--pick", "best-quality", "--out", tmp_path / "chosen")
    assert rc == 0, err
    [warning] = err.strip().splitlines()
    assert warning.startswith(f"warning: {root / 'trials' / 't0000.json'}: unreadable trial record (not JSON")
    assert warning.endswith("; skipped")
    assert "t0001" in (tmp_path / "chosen" / "README.md").read_text()


@pytest.mark.parametrize("damage", ["truncated", "not_utf8", "wrong_schema"])
def test_a_bad_experiment_record_is_one_line(tmp_path, capsys, damage):
    root = fabricated(tmp_path / "exp")
    record = root / "experiment.json"
    record.write_bytes(DAMAGE[damage](record.read_text()))
    for argv in (["report", root], ["status", root], ["export", root, "--pick", "knee", "--out", tmp_path / "x"]):
        one_line(*cli(capsys, *argv), f"{record}: unreadable experiment record")
    assert not (tmp_path / "x").exists() and not (root / "report").exists()


def test_report_where_it_cannot_write_is_one_line(tmp_path, capsys):
    root = fabricated(tmp_path / "exp")
    (root / "report").write_text("a file where the report folder goes")
    one_line(*cli(capsys, "report", root), "cannot write the report in", "File exists")
    one_line(*cli(capsys, "report", "/proc/self"), "not an experiment directory")


# ---------------------------------------------------------------- --out and the study's storage


def test_an_out_that_cannot_be_an_experiment_directory_is_one_line(tmp_path, capsys):
    space = infeasible(tmp_path)
    (tmp_path / "file").write_text("mine")
    for out, needle in [(tmp_path / "file", "exists and is not a directory"), ("/proc/loopnas", "is under /proc"),
                        (tmp_path / "file" / "sub", "cannot create the experiment directory"),
                        ("/sys/loopnas", "is under /sys")]:
        one_line(*cli(capsys, "sweep", space, "--out", out), f"--out {out}", needle)
    assert (tmp_path / "file").read_text() == "mine" and not Path("/proc/loopnas").exists()


def test_a_study_that_cannot_be_opened_leaves_no_directory_behind(tmp_path, capsys):
    # /proc exists, so the URL is well formed and its folder is there; sqlite cannot create a file in it
    space = infeasible(tmp_path, storage="sqlite:////proc/loopnas.db")
    out = tmp_path / "exp"
    one_line(*cli(capsys, "sweep", space, "--out", out), "search.storage sqlite:////proc/loopnas.db",
             "cannot open the study")
    assert not out.exists()  # nothing half-made: a rerun is not refused as "already holds an experiment"
    rc, _, err = cli(capsys, "sweep", infeasible(tmp_path), "--out", out)
    assert rc == 0 and "Traceback" not in err, err


def test_a_missing_database_driver_is_a_sweep_error_not_a_half_made_directory(tmp_path):
    space = load_space(infeasible(tmp_path))
    search = space.spec.search.model_copy(update={"storage": "mysql+nosuchdriver://user@localhost/db"})
    space = dataclasses.replace(space, spec=space.spec.model_copy(update={"search": search}))
    out = tmp_path / "exp"
    with pytest.raises(SweepError, match="search.storage mysql.*cannot open the study"):
        Sweep(space, out, "optuna")
    assert not out.exists()


def test_the_sweep_and_status_say_where_the_study_lives(tmp_path, capsys):
    db = tmp_path / "elsewhere" / "study.db"
    db.parent.mkdir()
    out = tmp_path / "exp"
    rc, _, err = cli(capsys, "sweep", infeasible(tmp_path, storage=f"sqlite:///{db}"), "--out", out)
    assert rc == 0, err
    assert err.splitlines()[0] == f"full: experiment {out} · study sqlite:///{db}"
    rc, text, _ = cli(capsys, "status", out)
    assert f"study: sqlite:///{db}" in text.splitlines()
    rc, text, _ = cli(capsys, "status", out, "--json")
    assert json.loads(text)["storage"] == f"sqlite:///{db}" and db.is_file()
    plain = tmp_path / "plain"
    cli(capsys, "sweep", infeasible(tmp_path), "--out", plain)
    rc, text, _ = cli(capsys, "status", plain, "--json")
    assert json.loads(text)["storage"] == str(plain / "study.journal")


# ---------------------------------------------------------------- the journal and the records on resume


def test_a_torn_journal_tail_is_cut_and_the_sweep_resumes(tmp_path, capsys):
    space, out = infeasible(tmp_path), tmp_path / "exp"
    assert cli(capsys, "sweep", space, "--out", out)[0] == 0
    journal = out / "study.journal"
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-25])  # the last append cut short
    rc, _, err = cli(capsys, "sweep", space, "--out", out, "--resume")
    assert rc == 0 and "Traceback" not in err, err
    assert "a torn last entry of" in err.splitlines()[0]
    assert journal.read_bytes().endswith(b"\n") and repair_journal(journal) == 0
    assert len(read_trials(out)) == 16


def test_a_damaged_journal_or_record_refuses_the_resume_in_one_line(tmp_path, capsys):
    space, out = infeasible(tmp_path), tmp_path / "exp"
    assert cli(capsys, "sweep", space, "--out", out)[0] == 0
    journal = out / "study.journal"
    whole = journal.read_bytes()
    lines = whole.split(b"\n")
    journal.write_bytes(b"\n".join([*lines[:2], lines[2][:15], *lines[3:]]))
    one_line(*cli(capsys, "sweep", space, "--out", out, "--resume"), f"{journal}: entry 3", "restore the file")
    journal.write_bytes(whole)
    record = out / "trials" / "t0004.json"
    record.write_bytes(b"\x00\xff")
    one_line(*cli(capsys, "sweep", space, "--out", out, "--resume"), f"{record}: unreadable trial record")
    assert (out / "experiment.json").is_file() and journal.read_bytes() == whole  # nothing deleted


# ---------------------------------------------------------------- full disks


def _fsize(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def test_a_failed_record_write_leaves_the_old_record_and_no_temporary_file(tmp_path):
    path = tmp_path / "t0000.json"
    write_json(path, {"old": True})
    code = (f"from runners.results.records import write_json; from pathlib import Path; "
            f"write_json(Path({str(path)!r}), {{'big': 'x' * 100000}})")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         preexec_fn=_fsize(4096), timeout=120)
    assert run.returncode != 0 and "File too large" in run.stderr  # EFBIG, raised by the kernel
    assert json.loads(path.read_text()) == {"old": True} and not stray(tmp_path)


def test_report_on_a_full_disk_is_one_line(tmp_path):
    root = fabricated(tmp_path / "exp")
    run = subprocess.run([sys.executable, "-m", "runners", "report", str(root)], capture_output=True, text=True,
                         cwd=REPO, preexec_fn=_fsize(1 << 20), timeout=300)  # the page inlines 4.7 MB of plotly.js
    one_line(run.returncode, run.stdout, run.stderr, f"cannot write the report in {root / 'report'}",
             "File too large", "free some space, then run  loopnas report")
    assert not stray(root) and not (root / "report" / "index.html").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 48 KiB tmpfs (room for a few records), to be grown with ``grow()``."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE tests cover full disks without it")

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)

    try:
        yield mnt, grow
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_stops_the_sweep_in_one_line_and_it_resumes(tmp_path, capsys, small_disk):
    mnt, grow = small_disk
    space, out = infeasible(tmp_path), mnt / "exp"
    line = one_line(*cli(capsys, "sweep", space, "--out", out), "No space left on device",
                    f"loopnas sweep {space} --out {out} --resume", after=2)
    assert line.startswith(f"error: the sweep stopped: a write in {out} failed")
    written = read_trials(out)  # every record on disk is whole
    assert 0 < len(written) < 16 and not stray(out)
    grow()
    rc, _, err = cli(capsys, "sweep", space, "--out", out, "--resume")
    assert rc == 0 and "Traceback" not in err, err
    records = read_trials(out)
    assert len(records) == 16 and {r.status for r in records} == {"infeasible"}
    assert len({(r.params["lr"], r.params["ffn"]) for r in records}) == 16  # no grid point lost or repeated
    assert not stray(out)


# ---------------------------------------------------------------- one driver per directory


def test_the_lock_names_its_holder_and_a_released_one_is_free(tmp_path):
    first = acquire(tmp_path / "exp")
    with pytest.raises(LockError) as refused:
        acquire(tmp_path / "exp")
    assert f"pid {os.getpid()} on {socket.gethostname()}" in str(refused.value)
    first.release()
    acquire(tmp_path / "exp").release()
    # the file left by a driver that died names a pid that is gone: it does not block
    (tmp_path / "exp" / LOCK).write_text(json.dumps({"pid": 2 ** 22 + 7, "host": "gone", "started": 0}))
    acquire(tmp_path / "exp").release()


def test_a_worker_whose_driver_is_gone_exits_quietly():
    import torch

    from runners.sweep.local import _worker_main

    threads = torch.get_num_threads()
    try:
        driver, worker = mp.Pipe()
        driver.close()
        assert _worker_main(worker, 1) is None  # EOF on its pipe: no job will come
        driver, worker = mp.Pipe()
        driver.send({"id": "t0000"})
        driver.close()
        assert _worker_main(worker, 1) is None  # BrokenPipeError on its first message
    finally:
        torch.set_num_threads(threads)


def _wait(exp: Path, driver: subprocess.Popen, done, what: str, timeout: float = 300) -> list[TrialRecord]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            records = read_trials(exp) if (exp / "trials").is_dir() else []
        except ValueError:
            records = []
        if done(records):
            return records
        assert driver.poll() is None, f"the sweep ended before {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_second_driver_is_refused_and_a_killed_one_does_not_block(tmp_path):
    # 300 steps a trial: the first driver must still be running while the second one starts
    # (its Python and torch import take seconds on a loaded machine; 60 steps did not)
    text = TRAINED.replace("{trials}", "3").replace("steps: 60,", "steps: 300,")
    path, exp = write_space(tmp_path, text), tmp_path / "exp"
    cmd = [sys.executable, "-m", "runners", "sweep", str(path), "--out", str(exp)]
    with open(tmp_path / "first.err", "w") as first_err:
        driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=first_err, start_new_session=True)
        try:
            before = _wait(exp, driver, lambda rs: any(r.status == "complete" for r in rs) and any(
                r.status == "running" and r.rungs for r in rs), "one trial completes and the next runs")
            second = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
            one_line(second.returncode, second.stdout, second.stderr,
                     f"is in use by another sweep driver (pid {driver.pid} on {socket.gethostname()}")
            assert driver.poll() is None  # the first driver goes on untouched
        finally:
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait()
    done = {r.id: r for r in read_trials(exp) if r.status == "complete"}
    assert set(done) >= {r.id for r in before if r.status == "complete"}
    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-2000:]
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete"] * 3
    assert sorted(r.params["lr"] for r in records) == [0.001, 0.002, 0.003]
    for rid, record in done.items():  # a complete trial is not trained again
        again = next(r for r in records if r.id == rid)
        assert (again.finished, again.wall_time) == (record.finished, record.wall_time)
    assert "Traceback" not in (tmp_path / "first.err").read_text()


def test_a_trial_interrupted_by_sigterm_keeps_all_its_rungs(tmp_path):
    path, exp = write_space(tmp_path, TRAINED.replace("{trials}", "1")), tmp_path / "exp"
    cmd = [sys.executable, "-m", "runners", "sweep", str(path), "--out", str(exp)]
    with open(tmp_path / "first.err", "w") as first_err:
        driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=first_err, start_new_session=True)
        try:
            [cut] = _wait(exp, driver, lambda rs: any(r.status == "running" and len(r.rungs) >= 2 for r in rs),
                          "two rungs are recorded")
        finally:
            os.kill(driver.pid, signal.SIGTERM)
            driver.wait()
    early = [r.step for r in read_trials(exp)[0].rungs]
    assert early and early[-1] < 60
    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    [record] = read_trials(exp)
    assert record.id == cut.id and record.status == "complete"
    assert [r.step for r in record.rungs] == [10, 20, 30, 40, 50, 60]  # those before the resume point too
    assert [r.step for r in record.replicates[0].rungs] == [10, 20, 30, 40, 50, 60]
    # the orphaned worker met a broken pipe at its next rung and ended without a traceback
    assert "Traceback" not in (tmp_path / "first.err").read_text()
