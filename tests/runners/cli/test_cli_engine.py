"""``--engine`` picks what runs a sweep's trials (optuna or ray) on ``sweep`` and
``calibrate``; ``--backend`` is no option of theirs (on ``train`` and ``bench`` it is the
model backend)."""
import pytest

from runners.cli import main
from runners.sweep.driver import SweepError

COMMANDS = {"sweep": "runners.sweep.run.run_sweep", "calibrate": "runners.calibrate.run_calibration"}


@pytest.fixture
def engine_given(monkeypatch):
    """The engine each command hands its runner; the runner then stops with a known error."""
    given = []

    def stop(*args, engine, **kwargs):
        given.append(engine)
        raise SweepError("stopped here")

    for target in COMMANDS.values():
        monkeypatch.setattr(target, stop)
    return given


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("argv, engine", [([], "optuna"), (["--engine", "ray"], "ray")], ids=["default", "engine"])
def test_engine(tmp_path, capsys, engine_given, command, argv, engine):
    assert main([command, "quickstart", "--out", str(tmp_path / "x"), *argv]) == 2
    assert engine_given == [engine]
    assert capsys.readouterr().err.strip().splitlines() == ["error: stopped here"]


@pytest.mark.parametrize("command", COMMANDS)
def test_backend_is_not_an_option_of_sweep_or_calibrate(tmp_path, capsys, engine_given, command):
    assert main([command, "quickstart", "--out", str(tmp_path / "x"), "--backend", "ray"]) == 2
    assert engine_given == []
    assert "--backend" in capsys.readouterr().err
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "--engine" in text and "--backend" not in text
