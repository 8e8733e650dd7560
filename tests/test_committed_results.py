"""Every committed calibration's markdown is what its committed raw values give (issue #29):
no number in experiments/results/calibration_*.md is typed by hand, and a change to the
statistics that moves one shows up here (rerun `python experiments/calibrations.py`)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "calibrations.py"


def _script():
    spec = importlib.util.spec_from_file_location("calibrations", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NAMES = sorted(p.stem.removeprefix("calibration_") for p in (ROOT / "experiments" / "results").glob("calibration_*.json"))


@pytest.mark.parametrize("name", NAMES)
def test_the_committed_markdown_is_regenerated_from_the_raw_values(name):
    current, regenerated = _script().regenerate(name)
    assert current == regenerated, f"run: python experiments/calibrations.py {name}"


def test_there_are_committed_calibrations():
    assert {"quickstart", "mixerloop"} <= set(NAMES)
