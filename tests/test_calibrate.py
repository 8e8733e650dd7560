"""loopnas calibrate: a fabricated space with a planted effect on one axis and none on the
other, the design, and a real (tiny) calibration through the CLI."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from nas.space import load_space
from runners.calibrate import analyse, design, markdown, scaled
from runners.sweep.driver import Sweep

SPACE = """\
name: planted
base: tiny_noloop
params:
  boundary: {target: loop.boundary, choices: [none, block]}
  T: {target: loop.T, choices: [2], when: {boundary: [block]}}
  ffn: {target: model.defaults.swiglu.hidden_size, choices: [96, 128]}
objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}
search: {sampler: grid, trials: 4, concurrency: 2}
"""


def load(tmp_path, text=SPACE):
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(text))
    return load_space(path)


def fabricate(space, out, seeds, quality):
    """Drive the sweep with made-up outcomes: ``quality(params, seed)``."""
    kind, plan = design(space)
    sweep = Sweep(scaled(space, 1.0), out, "optuna", seeds=seeds, planned=plan)
    while (job := sweep.next_job()) is not None:
        params = sweep.records[job.trial].params
        value = quality(params, job.config["seed"])
        sweep.finish(job.id, {"status": "complete",
                              "measured": [{"k": None, "value": value, "metrics": {"acc": value}}]})
    return analyse(space, [out], (1.0,), seeds, kind, len(plan))


def test_a_planted_effect_separates_and_a_null_axis_does_not(tmp_path):
    space = load(tmp_path)
    rng = np.random.default_rng(0)
    noise = {}

    def quality(params, seed):  # the loop adds 0.2; the FFN width does nothing; noise s.d. 0.02
        key = (json.dumps(params, sort_keys=True), seed)
        noise.setdefault(key, rng.normal(0, 0.02))
        return 0.5 + 0.2 * (params["boundary"] == "block") + noise[key]

    cal = fabricate(space, tmp_path / "exp", 4, quality)
    axes = {a.param: a for a in cal.axes}
    assert cal.design == "full grid" and cal.candidates == 4
    loop, ffn = axes["boundary"], axes["ffn"]
    assert loop.separates and loop.p_value < 0.01 and loop.effect == pytest.approx(0.2, abs=0.03)
    assert loop.level_effects['"block"'] > 0 > loop.level_effects['"none"']
    # one context per FFN width; alone, 4 + 4 values cannot reach p < 0.01 (the exact
    # permutation minimum is 2 / C(8, 4) = 0.029), together they do
    assert len(loop.contexts) == 2 and all(c.effect > 3 * c.se and c.p_value < 0.05 for c in loop.contexts)
    assert not ffn.separates and ffn.p_value > 0.01 and "within seed noise" in ffn.verdict
    assert axes["T"].effect is None and axes["T"].verdict == "one level: nothing to compare"
    assert "| **boundary** | all |" in markdown(cal)
    # each context row names its levels' means (T, one choice, is no context)
    from nas.noise import mean_se
    ctx = next(c for c in loop.contexts if c.context == {"ffn": 96})
    cells = {c.level: mean_se(c.values) for c in ctx.cells}
    assert f"| boundary | ffn=96 | none {cells['none'][0]:.3f} ± {cells['none'][1]:.3f} · block " in markdown(cal)


def test_a_large_effect_the_design_cannot_test_says_so_and_how_many_seeds_can(tmp_path):
    """Two candidates × 3 seeds: however large the effect, an exact permutation test cannot
    go below 2 / C(6, 3) = 0.1, so the verdict must not call it seed noise."""
    space = load(tmp_path, SPACE.replace("  ffn: {target: model.defaults.swiglu.hidden_size, choices: [96, 128]}\n", ""))

    def quality(params, seed):  # the loop adds 0.3 against a 0.01 seed spread
        return 0.5 + 0.3 * (params["boundary"] == "block") + 0.01 * seed

    loop = next(a for a in fabricate(space, tmp_path / "three", 3, quality).axes if a.param == "boundary")
    assert not loop.separates and loop.effect > 10 * loop.se
    assert loop.p_floor == pytest.approx(0.1) and loop.p_value >= loop.p_floor
    assert loop.seeds_to_test == 5 and "within seed noise" not in loop.verdict
    assert "cannot go below p = 0.1" in loop.verdict and "5 seeds per candidate" in loop.verdict
    from runners.calibrate import verdict
    inconsistent = loop.model_copy(update={"seeds_to_test": None, "p_value": 0.012})
    assert verdict(inconsistent, 3).startswith("not separated: effect") and "within seed noise" not in verdict(
        inconsistent, 3)
    five = next(a for a in fabricate(space, tmp_path / "five", 5, quality).axes if a.param == "boundary")
    assert five.separates and five.seeds_to_test is None and five.verdict.startswith("separates")


def test_one_parameter_at_a_time_design_for_large_spaces(tmp_path):
    space = load(tmp_path)
    kind, plan = design(space, max_points=2)
    assert kind == "one parameter at a time"
    # boundary varies at ffn=96; T is varied where its `when` holds; ffn varies at none
    assert {json.dumps(p, sort_keys=True) for p in plan} == {
        json.dumps(p, sort_keys=True) for p in (
            {"boundary": "none", "T": 2, "ffn": 96}, {"boundary": "block", "T": 2, "ffn": 96},
            {"boundary": "none", "T": 2, "ffn": 128})}


def test_calibrate_cli_trains_writes_and_resumes(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.replace("  ffn: {target: model.defaults.swiglu.hidden_size, choices: [96, 128]}\n", ""))
    out = tmp_path / "cal"
    cmd = [sys.executable, "-m", "runners", "calibrate", str(path), "--out", str(out), "--seeds", "2",
           "--budgets", "1,2"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    data = json.loads((out / "calibration.json").read_text())
    assert [b["multiple"] for b in data["budgets"]] == [1.0, 2.0]
    assert [b["steps"] for b in data["budgets"]] == [4, 8]
    [loop] = [a for a in data["axes"] if a["param"] == "boundary"]
    assert set(loop) >= {"param", "levels", "effect", "se", "p_value", "separates"}
    assert (out / "calibration.png").stat().st_size > 0 and "boundary" in run.stdout
    # rerunning resumes: nothing is trained again
    before = (out / "budget-1x" / "trials" / "t0000.json").stat().st_mtime
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (out / "budget-1x" / "trials" / "t0000.json").stat().st_mtime == before
    bad = subprocess.run([*cmd[:-1], "0,x"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --budgets")


def test_a_sweeps_report_shows_the_calibration(tmp_path):
    space = load(tmp_path)
    rng = np.random.default_rng(1)
    out = tmp_path / "exp" / "calibration"
    out.mkdir(parents=True)
    cal = fabricate(space, out / "budget-1x", 3, lambda p, s: 0.5 + 0.2 * (p["boundary"] == "block") + rng.normal(0, 0.02))
    from runners.calibrate import write
    write(cal, out)
    from runners.report import write_report
    html = write_report(out / "budget-1x").index.read_text()  # a budget is itself an experiment
    assert "Calibration" not in html  # no calibration inside budget-1x itself
    exp = tmp_path / "exp"
    import shutil
    shutil.copytree(out / "budget-1x", exp, dirs_exist_ok=True)  # the sweep's experiment beside it
    html = write_report(exp).index.read_text()
    assert "Calibration: can the proxy see each axis?" in html and "boundary" in html
    # the per-context rows with their level means, as in calibration.md
    assert "<td>ffn=96</td>" in html and "levels: mean ± s.e." in html


ELASTIC = """\
name: planted_elastic
base: tiny_elr
params:
  lr: {target: proxy.lr, choices: [0.001, 0.003]}
  ffn: {target: model.defaults.swiglu.hidden_size, choices: [96, 128]}
objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}
search: {sampler: grid, trials: 4, concurrency: 2}
"""


def test_elastic_trials_are_calibrated_at_each_loop_count(tmp_path):
    """An elastic trial is a curve: the planted lr effect exists at k = 2 only, so the
    analysis at k = 2 separates it and the one at k = 1 does not."""
    space = load(tmp_path, ELASTIC)
    kind, plan = design(space)
    rng = np.random.default_rng(1)
    sweep = Sweep(scaled(space, 1.0), tmp_path / "exp", "optuna", seeds=4, planned=plan)
    while (job := sweep.next_job()) is not None:
        params = sweep.records[job.trial].params
        at = {1: 0.5 + rng.normal(0, 0.01), 2: 0.6 + 0.2 * (params["lr"] == 0.003) + rng.normal(0, 0.01)}
        sweep.finish(job.id, {"status": "complete", "measured": [
            {"k": k, "value": v, "metrics": {"acc": v}} for k, v in at.items()]})
    cal = analyse(space, [tmp_path / "exp"], (1.0,), 4, kind, len(plan))
    per_k = {k: {a.param: a for a in axes} for k, axes in cal.budgets[0].per_k.items()}
    assert sorted(per_k) == ["1", "2"]
    assert per_k["2"]["lr"].separates and per_k["2"]["lr"].effect == pytest.approx(0.2, abs=0.03)
    assert not per_k["1"]["lr"].separates and not per_k["2"]["ffn"].separates
    assert "Elastic trials at k = 2:" in markdown(cal)


@pytest.mark.parametrize("where", ["file", "under_file", "proc"])
def test_a_bad_out_is_one_line_and_writes_nothing(tmp_path, where):
    space = tmp_path / "space.yaml"
    space.write_text(textwrap.dedent(SPACE))
    (tmp_path / "afile").write_text("mine")
    out = {"file": tmp_path / "afile", "under_file": tmp_path / "afile" / "sub", "proc": "/proc/loopnas"}[where]
    run = subprocess.run([sys.executable, "-m", "runners", "calibrate", str(space), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().startswith("error: --out") and len(run.stderr.strip().splitlines()) == 1
    assert (tmp_path / "afile").read_text() == "mine"
