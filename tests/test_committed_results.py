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


def _readme_row(question):
    line = next(l for l in (ROOT / "README.md").read_text().splitlines() if l.startswith(f"| {question} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_readme_quickstart_table_is_the_committed_calibration():
    """The README's calibration table: each number is the committed calibration's, regenerated."""
    from nas.space import load_space
    from runners.calibrate import Calibration, _p, levels_text

    cal = Calibration.model_validate_json((ROOT / "experiments/results/calibration_quickstart.json").read_text())
    cal = cal.reanalysed(load_space(ROOT / cal.source))
    axes = {a.param: a for a in cal.axes}
    ctx = {c.context["mixer"]: c for c in axes["boundary"].contexts}
    for question, c in [("loop, for GDN", ctx["gdn"]), ("loop, for attention", ctx["attn"])]:
        row = _readme_row(question)
        assert row[1] == levels_text(c) and row[3] == _p(c) and row[4] == f"{c.p_adjusted:.2g}"
        assert row[2].startswith(f"{c.effect:.3g}") and row[5] == ("yes" if c.separates else "no")
    row, mixer = _readme_row("mixer"), axes["mixer"]
    assert row[2] == f"{mixer.effect:.3g} ({mixer.effect / mixer.se:.1f} s.e.)"
    assert row[3] == _p(mixer) and row[4] == f"{mixer.p_adjusted:.2g}" and row[5] == "yes" == (
        "yes" if mixer.separates else "no")
    gdn = _readme_row("loop, for GDN")
    assert gdn[2] == f"{ctx['gdn'].effect:.3g} ({ctx['gdn'].effect / ctx['gdn'].se:.1f} s.e.)"
