"""An experiment directory someone else wrote (issue #34): symlinks planted where loopnas
writes are replaced, never written through; a FIFO, a device or an oversized file where a
record should be is skipped with one warning, without blocking or reading it whole; a
record status and report cannot use is skipped like a torn one; ``status --json`` is JSON;
a Ray ``--address`` where no cluster answers is one line within a stated timeout (tested on
loopback only: a closed port and a listener that never answers)."""
from __future__ import annotations

import json
import logging
import math
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_experiment_robustness import fabricated

from runners.checkpoint import atomic, own_dir, save_figure, write_text
from runners.results.records import (
    MAX_EXPERIMENT, MAX_RECORD, ExperimentRecord, Skipped, read_bounded, read_optional, read_trials,
)

from helpers import REPO

SECONDS = 5  # of CPU for a command that refuses or skips
RSS = 500 << 20  # peak resident memory of one command, bytes
# run the CLI and report the peak resident memory of this process alone on the last line, in kB.
# VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across fork and exec, so a child of
# a pytest process that has grown to 1.5 GB reports 1.5 GB whatever it used itself.
_RUN = ("import re, sys; from runners.cli import main; rc = main(sys.argv[1:]); "
        "hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1); "
        "print(f'maxrss {hwm}', file=sys.stderr); sys.exit(rc)")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bounded(*argv, cwd: Path = REPO, seconds: float = SECONDS, env: dict | None = None) -> tuple[int, str, str]:
    """``loopnas ARGV`` in a subprocess: it must end within 60 s of wall time (a FIFO would
    block forever), ``seconds`` of CPU and :data:`RSS` of memory."""
    start = _cpu()
    proc = subprocess.run([sys.executable, "-c", _RUN, *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=60, env={**os.environ, **(env or {})})
    cpu = _cpu() - start
    *err, last = proc.stderr.strip().splitlines() or ["maxrss 0"]
    rss = int(last.split()[-1]) << 10
    print(f"loopnas {' '.join(map(str, argv))}: {cpu:.2f} s CPU, {rss >> 20} MB")
    assert cpu < seconds, f"{cpu:.1f} s of CPU"
    assert rss < RSS, f"{rss >> 20} MB"
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, "\n".join(err)


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


# ---------------------------------------------------------------- writes replace symlinks


def test_the_atomic_write_and_figures_replace_a_symlink(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (tmp_path / "exp").mkdir()
    for name in ("calibration.json", "calibration.png"):
        (tmp_path / "exp" / name).symlink_to(outside)
    write_text(tmp_path / "exp" / "calibration.json", "{}")
    from matplotlib.figure import Figure
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "exp" / "calibration.png", dpi=20)
    assert outside.read_text() == "precious"
    assert not (tmp_path / "exp" / "calibration.png").is_symlink()
    assert (tmp_path / "exp" / "calibration.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "exp" / "calibration.json").read_text() == "{}"
    assert not [p for p in tmp_path.rglob("*.tmp")]
    with pytest.raises(RuntimeError), atomic(tmp_path / "exp" / "x"):  # a failed write leaves nothing
        raise RuntimeError
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["calibration.json", "calibration.png"]


def test_own_dir_replaces_a_symlinked_directory(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "report").symlink_to(target)
    out = own_dir(tmp_path / "report")
    assert out.is_dir() and not out.is_symlink() and target.is_dir()
    assert own_dir(out) == out  # an existing directory is kept


def test_report_writes_through_no_symlink(tmp_path):
    root = fabricated(tmp_path / "exp")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "report").mkdir()
    names = ("front.csv", "front_compute.png", "index.html", "hypervolume.png")
    for name in names:
        (outside / name).write_text("precious")
        (root / "report" / name).symlink_to(outside / name)
    rc, out, err = bounded("report", root, seconds=30, cwd=tmp_path)
    assert rc == 0, err
    assert all((outside / n).read_text() == "precious" for n in names)
    for name in names:
        assert not (root / "report" / name).is_symlink() and (root / "report" / name).stat().st_size > 0
    # a symlinked report/ itself: replaced by a directory of the experiment's own
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for p in (root / "report").iterdir():
        p.unlink()
    (root / "report").rmdir()
    (root / "report").symlink_to(elsewhere)
    rc, out, err = bounded("report", root, seconds=30, cwd=tmp_path)
    assert rc == 0, err
    assert list(elsewhere.iterdir()) == [] and (root / "report" / "index.html").is_file()
    assert not (root / "report").is_symlink()


# ---------------------------------------------------------------- reading someone else's experiment


def hostile(root: Path, kind: str) -> Path:
    """``trials/t0005.json`` made hostile: a FIFO, a link to a device, a directory, or a
    sparse file over the cap (its size, not its bytes, on disk)."""
    path = root / "trials" / "t0005.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in ("zero", "urandom"):
        path.symlink_to(f"/dev/{kind}")
    elif kind == "directory":
        path.mkdir()
    elif kind == "oversized":
        with path.open("wb") as f:
            f.truncate(MAX_RECORD + 1)
    return path


KINDS = ["fifo", "zero", "urandom", "directory", "oversized"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_bounded_reader_refuses_without_blocking(tmp_path, kind):
    (tmp_path / "trials").mkdir()
    path = hostile(tmp_path, kind)
    start = time.monotonic()
    with pytest.raises(Skipped, match="not a file" if kind != "oversized" else "larger than 8 MB"):
        read_bounded(path)
    problems = []
    assert read_trials(tmp_path, problems=problems) == [] and len(problems) == 1
    assert time.monotonic() - start < 2


def test_a_file_that_grows_past_the_cap_is_not_read_whole(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"1" * 100)
    assert read_bounded(path, cap=100) == b"1" * 100
    with pytest.raises(Skipped, match="larger than"):
        read_bounded(path, cap=99)


@pytest.mark.parametrize("kind", KINDS)
def test_status_report_and_export_skip_a_hostile_record(tmp_path, kind):
    root = fabricated(tmp_path / "exp")
    path = hostile(root, kind)
    rc, out, err = bounded("status", root)
    assert rc == 0 and "3 complete" in out, err
    [warning] = warnings_of(err)
    assert str(path) in warning and warning.endswith("skipped")
    rc, out, err = bounded("status", root, "--json")
    assert rc == 0 and len(json.loads(out)["unreadable"]) == 1, err
    rc, out, err = bounded("export", root, "--pick", "knee", "--out", tmp_path / "exported", seconds=15)
    assert "t0005.json" in err and "Traceback" not in err, err
    rc, out, err = bounded("report", root, seconds=30, cwd=tmp_path)
    assert rc == 0 and f"left out: t0005.json: unreadable record" in out, (out, err)


@pytest.mark.parametrize("kind", ["fifo", "zero", "oversized"])
def test_a_hostile_experiment_record_is_one_line(tmp_path, kind):
    root = fabricated(tmp_path / "exp")
    path = root / "experiment.json"
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        with path.open("wb") as f:
            f.truncate(MAX_EXPERIMENT + 1)
    for command in ("status", "report"):
        rc, out, err = bounded(command, root, seconds=SECONDS if command == "status" else 10)
        assert rc == 2 and len(err.splitlines()) == 1 and str(path) in err, (rc, err)


def test_an_unreadable_calibration_is_one_warning_and_none(tmp_path, caplog):
    assert read_optional(tmp_path / "calibration.json", ExperimentRecord) is None  # none: no warning
    big = tmp_path / "calibration.json"
    with big.open("wb") as f:
        f.truncate(60 << 20)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING, logger="loopnas.records"):
        assert read_optional(big, ExperimentRecord, MAX_EXPERIMENT) is None
        assert read_optional(fifo, ExperimentRecord, MAX_EXPERIMENT) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "larger than 4 MB" in lines[0] and "a FIFO" in lines[1], lines


# ---------------------------------------------------------------- records status and report cannot use


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


UNUSABLE = {  # damage -> (what the report says, left out by the report, skipped by every reader)
    "invalid_arch": (lambda d: d["arch"].update(layers="many"), "arch is not a valid spec", False),
    "empty_cost": (lambda d: d.update(cost={}), "unusable cost sheet", False),
    "nan_cost": (lambda d: d["cost"].update(projection_flops_per_token=math.nan), "unusable cost sheet", False),
    "string_cost": (lambda d: d["cost"].update(kv_cache_bytes="lots"), "unusable cost sheet", False),
    "negative_se": (lambda d: d["points"][0].update(se={"acc": -0.5}), "not a standard error", True),
    "repeated_points": (lambda d: d.update(points=d["points"] * 3), "one point per loop count", True),
}


@pytest.mark.parametrize("damage", UNUSABLE)
def test_a_record_that_cannot_be_used_is_left_out_with_one_line(tmp_path, damage):
    change, why, unreadable = UNUSABLE[damage]
    root = fabricated(tmp_path / "exp")
    _edit(root / "trials" / "t0001.json", change)
    rc, out, err = bounded("report", root, seconds=30, cwd=tmp_path)
    assert rc == 0, err
    left = [line for line in out.splitlines() if line.startswith("left out:")]
    assert len(left) == 1 and "t0001" in left[0] and why in left[0], out
    assert (root / "report" / "index.html").is_file()
    rc, out, err = bounded("status", root, "--json")
    assert rc == 0, err
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert len(data["unreadable"]) == int(unreadable) and len(warnings_of(err)) == int(unreadable)


def test_status_json_has_null_for_unknown_numbers(tmp_path):
    root = fabricated(tmp_path / "exp")
    _edit(root / "trials" / "t0001.json", lambda d: d["points"][0].update(se={"acc": math.nan}))
    _edit(root / "trials" / "t0002.json", lambda d: d["points"][0]["values"].update(acc=math.nan))
    rc, out, err = bounded("status", root, "--json")
    assert rc == 0, err
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    [t1] = [p for p in data["front"] if p["trial"] == "t0001"]
    assert t1["se"]["acc"] is None


# ---------------------------------------------------------------- Ray addresses (loopback only)


@pytest.fixture
def silent_port():
    """A port on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def closed_port():
    """A port on 127.0.0.1 that nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_bad_addresses_are_one_line_within_the_timeout(silent_port, closed_port):
    from runners.sweep.ray_engine import RayAddressError, check_address

    cases = {f"127.0.0.1:{closed_port}": "connection refused", f"127.0.0.1:{silent_port}": "no answer within 0.5 s",
             "http://127.0.0.1:8265": "a URL is not a Ray address", "": "--address is empty",
             "   ": "--address is empty", "127.0.0.1": "not host:port", "127.0.0.1:99999": "not host:port",
             "127.0.0.1:x": "not host:port"}
    for address, why in cases.items():
        start = time.monotonic()
        with pytest.raises(RayAddressError) as info:
            check_address(address, timeout=0.5)
        line = str(info.value)
        assert why in line and "ray start --head" in line and len(line.splitlines()) == 1, line
        assert time.monotonic() - start < 3, address


def test_the_timeout_is_stated_and_overridable(monkeypatch):
    from runners.sweep.ray_engine import CONNECT_TIMEOUT, TIMEOUT_ENV, RayAddressError, connect_timeout

    assert CONNECT_TIMEOUT <= 30
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert connect_timeout() == CONNECT_TIMEOUT
    monkeypatch.setenv(TIMEOUT_ENV, "0.25")
    assert connect_timeout() == 0.25
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(RayAddressError, match=TIMEOUT_ENV):
        connect_timeout()


@pytest.mark.parametrize("where", ["silent", "url"])
def test_sweep_on_a_silent_address_is_one_line(tmp_path, silent_port, where):
    from runners.sweep.ray_engine import TIMEOUT_ENV

    space = tmp_path / "space.yaml"
    space.write_text("name: ray_address\nbase: tiny_noloop\n"
                     "params: {lr: {target: proxy.lr, choices: [0.001, 0.002]}}\n"
                     "objectives: [{metric: acc, direction: maximize}]\n"
                     "proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4}\n"
                     "search: {sampler: grid, trials: 2}\n")
    address = f"127.0.0.1:{silent_port}" if where == "silent" else "http://127.0.0.1:8265"
    start = time.monotonic()
    rc, out, err = bounded("sweep", space, "--engine", "ray", "--address", address, "--out", tmp_path / "exp",
                           seconds=15, env={TIMEOUT_ENV: "1"})
    assert time.monotonic() - start < 45
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and address in errors[0] and "ray start --head" in errors[0], err
    # the sweep's first line and its progress line come first: run_sweep makes the directory
    # before the engine starts (checking the address there would leave the error alone)
    assert len(err.splitlines()) <= 3 and err.splitlines()[-1] == errors[0], err


def test_a_fifo_as_the_one_shot_summary_is_no_check_not_a_hang(tmp_path):
    """EXP/oneshot.json is read bounded, regular files only, like every file of an experiment."""
    import os

    from runners.report.oneshot import read_check
    os.mkfifo(tmp_path / "oneshot.json")
    assert read_check(tmp_path) is None
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "oneshot.json").write_bytes(b"{" + b" " * (8 << 20))
    assert read_check(tmp_path / "big") is None
