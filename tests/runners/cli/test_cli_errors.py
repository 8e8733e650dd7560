"""Known errors become one line and exit code 2 in ``main()`` alone: every one derives from
``nas.errors.LoopnasError``, whichever command raises it."""
import pytest

from builders.layers.fla_runtime import FlaUnavailableError
from nas.errors import LoopnasError, SpecError
from runners.checkpoint import CheckpointError
from runners.cli import main
from runners.cli.common import UsageError
from runners.export import ExportError
from runners.oneshot.supernet import OneShotError
from runners.sweep.devices import PoolError
from runners.sweep.driver import SweepError
from runners.sweep.lock import LockError
from runners.results.records import RecordError


@pytest.mark.parametrize("error", [SpecError, UsageError, SweepError, LockError, RecordError, CheckpointError,
                                   ExportError, OneShotError, PoolError, FlaUnavailableError])
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


def test_fla_off_cuda_is_one_line_from_main(tmp_path, capsys):
    """The model backend's usage error reaches ``main()`` as a LoopnasError like every other."""
    assert main(["train", "tiny_noloop", "--task", "hop_induction", "--steps", "2", "--set", "backend=fla"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: backend='fla'") and "use backend='torch' or 'auto'" in err[0]
