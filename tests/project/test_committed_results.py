"""Every committed calibration's and transfer's markdown is what its committed raw values give
(issues #29, #30): no number in experiments/results/{calibration,transfer}_*.md is typed by
hand, and a change to the statistics that moves one shows up here (rerun `python
experiments/regenerate.py`)."""
import importlib.util
from pathlib import Path

import pytest
from helpers import REPO

ROOT = REPO
SCRIPT = ROOT / "experiments" / "regenerate.py"


def _script():
    spec = importlib.util.spec_from_file_location("regenerate", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NAMES = sorted(p.stem for kind in ("calibration", "transfer")
               for p in (ROOT / "experiments" / "results").glob(f"{kind}_*.json"))


@pytest.mark.parametrize("name", NAMES)
def test_the_committed_markdown_is_regenerated_from_the_raw_values(name):
    current, regenerated = _script().regenerate(name)
    assert current == regenerated, f"run: python experiments/regenerate.py {name}"


def test_there_are_committed_calibrations():
    assert {"calibration_quickstart", "calibration_mixerloop"} <= set(NAMES)


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


def test_the_readme_front_is_the_quickstarts_candidates_recomputed():
    """The README's printed front (means ± s.e., p_front, ≈ and the noise sentence) is what
    runners.results.front gives on the committed per-seed values of the same candidates (the
    quickstart sweep trains exactly the calibration's grid with the same seeds)."""
    import optuna

    from nas.cost import projection_flops
    from nas.space import _label, load_space
    from runners.calibrate import Calibration
    from runners.results.front import front, noise_sentence
    from runners.results.records import Objective, Point, Replicate, TrialRecord

    cal = Calibration.model_validate_json((ROOT / "experiments/results/calibration_quickstart.json").read_text())
    space = load_space(ROOT / cal.source)
    objectives = [Objective(name="acc", direction="maximize", measured=True),
                  Objective(name="projection_flops", direction="minimize", measured=False)]
    records = []
    for i, trial in enumerate(sorted({v.trial for v in cal.raw})):
        vals = [v for v in cal.raw if v.trial == trial and v.k is None]
        arch = space.candidate(optuna.trial.FixedTrial({k: _label(x) for k, x in vals[0].params.items()}))[0]
        flops = projection_flops(arch).total
        reps = [Replicate(index=j, seed=v.seed, status="complete",
                          points=[Point(values={"acc": v.value, "projection_flops": flops})]) for j, v in enumerate(vals)]
        mean = sum(v.value for v in vals) / len(vals)
        records.append(TrialRecord(id=f"t{i:04d}", number=i, status="complete", replicates=reps,
                                   points=[Point(values={"acc": mean, "projection_flops": flops}, n=len(vals))]))
    members = front(records, objectives)
    block = (ROOT / "README.md").read_text().split("It ends with this front")[1].split("```")[1]
    rows = [l for l in block.splitlines() if l.startswith("│ t")]
    assert len(rows) == len(members)
    for row, m in zip(rows, members):
        cells = [c.strip() for c in row.strip("│").split("│")]
        import math
        se = math.sqrt(sum((r.points[0].values["acc"] - m.values["acc"]) ** 2
                           for r in next(x for x in records if x.id == m.trial).replicates) / (m.n - 1) / m.n)
        assert cells[1] == f"{m.values['acc']:.4f} ± {se:.2g}"
        assert cells[2] == f"{m.values['projection_flops']:.4g}"
        assert cells[3] == f"{m.p_front:.2f}" + (" ≈" if m.tied else "")
    sentence = " ".join(l.strip() for l in block.splitlines() if not l.startswith(("│", "┃")) and l.strip())
    assert sentence == noise_sentence(members, "acc", 5) + " (≈: within noise of a neighbour)"


def test_the_readme_transfer_table_is_the_committed_transfers():
    """The README's transfer table: τ, its interval, the pair counts and the range of unique
    parameters at each scale are the committed transfers', reanalysed from their per-seed values."""
    from runners.transfer.analysis import Transfer, reanalysed

    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in (ROOT / "README.md").read_text().split("### Does the front hold at larger scale?")[1]
            .split("###")[0].splitlines() if line.startswith(("| quickstart |", "| mixerloop |", "| mixerloop_lm |"))]
    assert len(rows) == 4
    for row in rows:
        t = reanalysed(Transfer.model_validate_json(
            (ROOT / f"experiments/results/transfer_{row[0]}.json").read_text()))
        label, params = row[1].split(" ")
        s = next(s for s in t.scales if s.label == label.replace("×", "x"))
        lo, hi = s.tau_ci
        assert row[2] == f"{s.tau:.2f} ({lo:.2f}–{hi:.2f})"
        p = s.pairs
        assert row[3] == f"{p.kept} / {p.flipped} / {p.within_noise}"
        assert row[4] == f"{p.newly_separated} of {p.unseparated}"
        sizes = [round(c.unique_params / 1e3) for c in s.candidates]
        span = f"{min(sizes)}k" if min(sizes) == max(sizes) else f"{min(sizes)}–{max(sizes)}k"
        assert params == f"({span})", (params, sizes)
