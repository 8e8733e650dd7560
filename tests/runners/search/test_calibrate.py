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
        sweep.on_outcome(job.id, {"status": "complete",
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


@pytest.mark.slow
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
        sweep.on_outcome(job.id, {"status": "complete", "measured": [
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


# ---- the verdicts' statistics on the shipped spaces' designs (issue #29) ------------------


def _candidates_of(space):
    """The design's candidates as records hold them: parameter values (not labels), with the
    parameters whose ``when`` does not hold left out, each candidate once."""
    from nas.space import _label

    kind, plan = design(space)
    out = {}
    for labels in plan:
        params = {}
        for name, label in labels.items():
            spec = space.spec.params[name]
            if all(_label(labels[o]) in {_label(a) for a in allowed} or labels[o] in allowed
                   for o, allowed in spec.when.items()):
                params[name] = next((c for c in spec.choices if _label(c) == label), label)
        out[json.dumps(params, sort_keys=True)] = params
    return kind, list(out.values())


def _raw(cands, seeds, value):
    from runners.calibrate import RawValue
    return [RawValue(budget=1.0, trial=f"t{i:04d}", spec_hash=f"h{i}", params=p, seed=s, value=value(i, p, s))
            for i, p in enumerate(cands) for s in range(seeds)]


@pytest.mark.slow
@pytest.mark.parametrize("name,seeds", [("quickstart", 5), ("mixerloop", 4), ("lt2", 3)])
def test_no_axis_separates_on_null_data_beyond_alpha(name, seeds):
    """Family-wise: on each shipped space's own design and seeds, with a seed effect and no
    candidate effect, any axis or context called 'separates' in at most α of 120 simulated
    calibrations plus 3 binomial standard errors."""
    from runners.calibrate import ALPHA, analyse_raw

    space = load_space(f"spaces/{name}.yaml")
    kind, cands = _candidates_of(space)
    rng = np.random.default_rng(len(name))
    sims, hits = 120, 0
    for _ in range(sims):
        luck = rng.normal(0, 0.03, seeds)
        noise = rng.normal(0, 0.03, (len(cands), seeds))
        cal = analyse_raw(space, _raw(cands, seeds, lambda i, p, s: 0.5 + luck[s] + noise[i, s]), (1.0,), seeds,
                          kind, len(cands))
        hits += any(a.separates or any(c.separates for c in a.contexts) for a in cal.axes)
    assert hits / sims <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / sims)


def test_the_standard_error_and_the_three_se_rule():
    """s.e. is that of a difference of two level means (√2 · σ / √n: mutation drops the √2),
    and an effect between 2 and 3 s.e. does not separate however small its p (mutation:
    MIN_SE = 2)."""
    from runners.calibrate import MIN_SE, analyse_raw

    space = load_space("spaces/quickstart.yaml")
    kind, cands = _candidates_of(space)
    seeds = 5
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1, (len(cands), seeds))
    noise -= noise.mean(1, keepdims=True)  # every candidate's mean is exactly its planted value
    noise /= noise.std(1, ddof=1, keepdims=True)  # and its sample s.d. exactly 0.01

    def at(effect):
        value = lambda i, p, s: 0.5 + effect * (p["mixer"] == "gdn") + 0.01 * noise[i, s]  # noqa: E731
        return next(a for a in analyse_raw(space, _raw(cands, seeds, value), (1.0,), seeds, kind,
                                           len(cands)).axes if a.param == "mixer")

    axis = at(0.5)
    # unpaired: pooled variance 0.01²; paired: what is left after the seed effect (0 here: none planted,
    # but the noise is not shared, so the residual variance is close to 0.01²)
    n = seeds * 3
    assert axis.paired and axis.separates
    assert axis.se == pytest.approx(np.sqrt(2 * _resid_var(noise * 0.01) / n), rel=1e-9)
    # the rule itself: 2.5 s.e. with a tiny adjusted p does not separate; 3.1 s.e. does
    from runners.calibrate import AxisResult, _separates, verdict
    assert not _separates(2.5 * axis.se, axis.se, 1e-4) and _separates(3.1 * axis.se, axis.se, 1e-4)
    assert not _separates(3.1 * axis.se, axis.se, 0.011)
    small = AxisResult(param="mixer", levels=["gdn", "attn"], effect=2.5 * axis.se, se=axis.se, p_value=1e-4,
                       p_upper=1e-4, p_adjusted=7e-4, p_floor=1e-5, paired=True, test="exact permutation test")
    assert "under 3 s.e." in verdict(small, 7)


def _resid_var(y):
    """Residual variance of the candidate × seed table after both main effects (the paired s.e.'s)."""
    r = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    return (r ** 2).sum() / ((y.shape[0] - 1) * (y.shape[1] - 1))


def test_a_calibration_is_recomputed_from_its_raw_values(tmp_path):
    space = load(tmp_path)
    rng = np.random.default_rng(2)
    cal = fabricate(space, tmp_path / "exp", 4, lambda p, s: 0.5 + 0.1 * (p["boundary"] == "block")
                    + rng.normal(0, 0.02))
    again = type(cal).model_validate_json(cal.model_dump_json()).reanalysed(space)
    assert markdown(again) == markdown(cal) and len(cal.raw) == 16


def test_find_refuses_a_calibration_of_another_space_and_a_hollow_one(tmp_path, caplog):
    """A calibration is shown beside an experiment only when it calibrates that space: one of
    another space under the same name, one with no budget or with an empty cell is one warning
    and nothing shown (issue #34)."""
    from runners.calibrate import find, space_key, write

    space = load(tmp_path)
    cal = fabricate(space, tmp_path / "exp", 3, lambda p, s: 0.5 + 0.01 * s)
    (tmp_path / "c" / "calibration").mkdir(parents=True)
    write(cal, tmp_path / "c" / "calibration")
    mine = space.spec.model_dump(mode="json")
    assert find(tmp_path / "c", mine) is not None and cal.space_key == space_key(mine)
    other = load(tmp_path, SPACE.replace("choices: [96, 128]", "choices: [96, 160]")).spec.model_dump(mode="json")
    with caplog.at_level("WARNING"):
        assert find(tmp_path / "c", other) is None
    assert "calibrates another space" in caplog.text
    for hollow in (cal.model_copy(update={"budgets": []}),
                   type(cal).model_validate_json(cal.model_dump_json().replace('"values":[', '"values":[] ,"x":[', 1))):
        (tmp_path / "c" / "calibration" / "calibration.json").write_text(hollow.model_dump_json())
        assert find(tmp_path / "c", mine) is None
