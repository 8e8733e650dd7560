"""``--engine`` picks what runs a sweep's trials (optuna or ray) on ``sweep`` and
``calibrate``; ``--backend``, its old spelling there, still works with one deprecation line
(on ``train`` and ``bench``, ``--backend`` is the model backend)."""
import pytest

from runners.cli import main
from runners.sweep.driver import SweepError

COMMANDS = {"sweep": "runners.sweep.run.run_sweep", "calibrate": "runners.calibrate.run_calibration"}


@pytest.fixture
def engine_given(monkeypatch):
    """The engine each command hands its runner; the runner then stops with a known error."""
    given = []

    def stop(*args, backend, **kwargs):
        given.append(backend)
        raise SweepError("stopped here")

    for target in COMMANDS.values():
        monkeypatch.setattr(target, stop)
    return given


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("argv, engine, deprecated", [
    ([], "optuna", False),
    (["--engine", "ray"], "ray", False),
    (["--backend", "ray"], "ray", True),
], ids=["default", "engine", "old-spelling"])
def test_engine_and_its_old_spelling(tmp_path, capsys, engine_given, command, argv, engine, deprecated):
    assert main([command, "quickstart", "--out", str(tmp_path / "x"), *argv]) == 2
    assert engine_given == [engine]
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == "error: stopped here"
    warnings = [line for line in lines if "deprecated" in line]
    assert len(lines) == 1 + deprecated and len(warnings) == deprecated
    if deprecated:
        assert warnings[0].startswith("warning: --backend is deprecated here: use --engine")


@pytest.mark.parametrize("command", COMMANDS)
def test_both_spellings_at_once_is_one_error(tmp_path, capsys, engine_given, command):
    assert main([command, "quickstart", "--out", str(tmp_path / "x"), "--engine", "ray", "--backend", "ray"]) == 2
    assert engine_given == []
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "error: give --engine only (--backend is its deprecated spelling)"


def test_the_old_spelling_is_hidden_from_help(capsys):
    for command in COMMANDS:
        assert main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert "--engine" in text and "--backend" not in text
