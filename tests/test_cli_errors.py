"""Known errors become one line and exit code 2 in ``main()`` alone: every one derives from
``nas.errors.LoopnasError``, whichever command raises it."""
import pytest

from nas.errors import LoopnasError, SpecError
from runners.checkpoint import CheckpointError
from runners.cli import main
from runners.cli.common import UsageError
from runners.export import ExportError
from runners.sweep.driver import SweepError
from runners.sweep.lock import LockError
from runners.sweep.records import RecordError


@pytest.mark.parametrize("error", [SpecError, UsageError, SweepError, LockError, RecordError, CheckpointError,
                                   ExportError])
def test_every_known_error_is_a_loopnas_error(error):
    assert issubclass(error, LoopnasError)


@pytest.mark.parametrize("error", [LockError, RecordError, CheckpointError])
def test_a_known_error_that_no_command_catches_is_one_line(tmp_path, capsys, monkeypatch, error):
    def fail(*args, **kwargs):
        raise error(f"{tmp_path}: held elsewhere")

    monkeypatch.setattr("runners.sweep.run.run_sweep", fail)
    assert main(["sweep", "quickstart", "--out", str(tmp_path / "x")]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert captured.err.strip().splitlines() == [f"error: {tmp_path}: held elsewhere"]


def test_each_line_of_a_known_error_is_an_error_line(tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise SweepError("first problem\nsecond problem")

    monkeypatch.setattr("runners.sweep.run.run_sweep", fail)
    assert main(["sweep", "quickstart", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: first problem", "error: second problem"]
