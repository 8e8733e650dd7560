"""Hostile and careless input, round two (issue #34): each class below is made in the test
from its description. A refusal is one line, exit code 2, no traceback, in bounded CPU time
and memory, with nothing written outside the chosen place and nothing the user made removed.

- a resume after an edit of what defines a candidate (the base spec file, a Python space's
  ``sample()``, the proxy, the objectives) is refused, naming it;
- a sweep refused at start leaves nothing it created (a rerun is not "already holds an
  experiment");
- every count and size has a cap ``validate`` checks (seeds, budgets, CPUs and GPUs per
  trial, trials, concurrency, the one-shot self-check's n and seeds), and the flags ``--seeds``, ``--trials``, ``--budgets``,
  ``--scale-to`` say theirs in one line;
- calibrate refuses a one-candidate space before training, and exits 1 with the first
  reason when every trial failed;
- a Python space's import or ``sample()`` raising anything is one line; a sweep in which
  every trial failed exits 1 with the first reason;
- a ``base:`` that is not a spec is one line.
"""
import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from nas.errors import SpecError
from nas.oneshot import MAX_CHECK
from nas.proxy import MAX_SEEDS, MAX_STEPS
from nas.space import MAX_CPUS, MAX_GPUS, MAX_TRIALS, changes, identity, load_space
from runners.sweep.driver import Sweep, SweepError
from test_hostile_dirs import bounded
from helpers import REPO, cli, one_line

OBJECTIVES = "objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]"
PROXY = "proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}"


def yaml_space(tmp_path: Path, *, base: str = "tiny_noloop", params: str = "{target: loop.boundary, choices: [none, block]}",
               proxy: str = PROXY, objectives: str = OBJECTIVES, extra: str = "", name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"name: round2\nbase: {base}\nparams:\n  boundary: {params}\n{objectives}\n{proxy}\n{extra}\n")
    return path


def py_space(tmp_path: Path, body: str, name: str = "space.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        SPACE = {{"name": "py", "base": "tiny_noloop",
                 "objectives": [{{"metric": "acc", "direction": "maximize"}}],
                 "proxy": {{"task": "s5", "task_params": {{"seq_len": 4, "degree": 2}}, "steps": 4,
                           "batch_size": 4, "eval_every": 2}},
                 "search": {{"sampler": "random", "trials": 3, "concurrency": 1}}}}
        """) + textwrap.dedent(body))
    return path


def started(space: Path, out: Path) -> bytes:
    """An experiment started in ``out`` (no trial run): its experiment.json, as written."""
    Sweep(load_space(space), out, "optuna").close()
    return (out / "experiment.json").read_bytes()


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------- 1. resume after an edit


def test_resume_after_editing_the_base_spec_file_is_refused(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text((REPO / "spaces" / "archs" / "tiny_noloop.yaml").read_text())
    space, out = yaml_space(tmp_path, base="base.yaml"), tmp_path / "exp"
    record = started(space, out)
    assert set(json.loads(record)["identity"]) == {"base", "proxy", "objectives"}
    base.write_text(base.read_text().replace("width: 64", "width: 32"))
    line = one_line(*bounded("sweep", space, "--out", out, "--resume"), f"--resume: {out} was started with another "
                                                                        "base spec (base.yaml changed since)")
    assert "mix old and new candidates" in line and f"--out {out}-2" in line
    assert (out / "experiment.json").read_bytes() == record  # nothing rewritten
    base.write_text(base.read_text().replace("width: 32", "width: 64"))  # undone: it resumes
    Sweep(load_space(space), out, "optuna", resume=True).close()


def test_resume_after_editing_sample_is_refused(tmp_path, capsys):
    body = """\
        def sample(trial, base):
            base["loop"] = {{"boundary": trial.suggest_categorical("boundary", ["none", "block"]), "T": {T}}}
            return base
        """
    space, out = py_space(tmp_path, body.format(T=2)), tmp_path / "exp"
    started(space, out)
    space.write_text(space.read_text().replace('"T": 2', '"T": 3'))  # SPACE unchanged: only sample() moved
    one_line(*cli(capsys, "sweep", space, "--out", out, "--resume"), "another Python space (space.py changed since)")


@pytest.mark.parametrize("edit, word", [(("steps: 4", "steps: 6"), "proxy"),
                                        (("direction: minimize", "direction: maximize"), "objectives"),
                                        (("choices: [none, block]", "choices: [none, mixer]"), "params")])
def test_resume_after_editing_the_space_names_what_changed(tmp_path, capsys, edit, word):
    space, out = yaml_space(tmp_path), tmp_path / "exp"
    started(space, out)
    space.write_text(space.read_text().replace(*edit))
    line = one_line(*cli(capsys, "sweep", space, "--out", out, "--resume"), "was started with another ")
    assert line.split("another ", 1)[1].startswith(word), line


def test_an_experiment_without_identity_still_resumes(tmp_path):
    """Written before the identity was kept: what can be compared (the space's mapping) is."""
    base = tmp_path / "base.yaml"
    base.write_text((REPO / "spaces" / "archs" / "tiny_noloop.yaml").read_text())
    space, out = yaml_space(tmp_path, base="base.yaml"), tmp_path / "exp"
    started(space, out)
    record = json.loads((out / "experiment.json").read_text())
    del record["identity"]
    (out / "experiment.json").write_text(json.dumps(record))
    base.write_text(base.read_text().replace("width: 64", "width: 32"))  # cannot be seen: it resumes
    Sweep(load_space(space), out, "optuna", resume=True).close()
    space.write_text(space.read_text().replace("steps: 4", "steps: 6"))
    with pytest.raises(SweepError, match="another proxy"):
        Sweep(load_space(space), out, "optuna", resume=True)


def test_changes_compares_what_both_sides_hold(tmp_path):
    loaded = load_space(yaml_space(tmp_path))
    dump = loaded.spec.model_dump(mode="json")
    assert changes(loaded, dump, identity(loaded)) == [] and changes(loaded, dump, None) == []
    assert changes(loaded, {**dump, "added_later": 1}, None) == []  # a field one side lacks is no change
    assert changes(loaded, dump, {**identity(loaded), "base": "0" * 16}) == ["base spec (tiny_noloop changed since)"]


# ---------------------------------------------------------------- 2. failed starts leave nothing


def test_a_start_refused_for_gpus_leaves_nothing(tmp_path):
    space = yaml_space(tmp_path, extra="search: {resources: {gpu: 2}}")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for out in (tmp_path / "new" / "exp", mine, tmp_path / "new" / "exp"):  # twice: the rerun is the same line
        one_line(*bounded("sweep", space, "--out", out, env={"CUDA_VISIBLE_DEVICES": "0"}),
                 "resources.gpu: 2 needs 2 GPUs per trial; 1 visible")
    assert not (tmp_path / "new").exists() and tree(mine) == ["notes.txt"]


def test_a_start_refused_for_a_ray_address_leaves_nothing(tmp_path, capsys):
    space, out = yaml_space(tmp_path), tmp_path / "exp"
    one_line(*cli(capsys, "sweep", space, "--engine", "ray", "--address", "127.0.0.1:1", "--out", out),
             "--address 127.0.0.1:1: no Ray cluster")
    assert not out.exists()


def test_an_engine_that_fails_before_the_first_trial_leaves_nothing_it_made(tmp_path, capsys, monkeypatch):
    import runners.sweep.local

    def refuse(sweep, on_change=None):
        raise SweepError("the pool cannot start")

    monkeypatch.setattr(runners.sweep.local, "run_local", refuse)
    space = yaml_space(tmp_path)
    mine = tmp_path / "mine"
    (mine / "trials").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    for out in (tmp_path / "a" / "exp", mine):
        rc, _, err = cli(capsys, "sweep", space, "--out", out)
        assert rc == 2 and err.strip().splitlines()[-1] == "error: the pool cannot start", err
    assert not (tmp_path / "a").exists()
    assert tree(mine) == ["notes.txt", "trials"]  # the user's, kept; the sweep's own files, gone
    monkeypatch.undo()
    Sweep(load_space(space), mine, "optuna").close()  # the rerun starts afresh, no --resume needed


# ---------------------------------------------------------------- 3. sizes and numbers


@pytest.mark.parametrize("text, where, message", [
    ("proxy: {task: s5, steps: 4, seeds: 1000000}", "proxy.seeds: ", f"at most {MAX_SEEDS}"),
    ("proxy: {task: s5, steps: 1000000000000}", "proxy.steps: ", f"at most {MAX_STEPS}"),
    ("proxy: {task: s5, tokens: 1000000000000000000}", "proxy.tokens: ", "at most"),
    ("search: {resources: {cpu: 1.0e9}}", "search.resources.cpu: ", f"more than {MAX_CPUS}"),
    ("search: {resources: {gpu: 1.0e9}}", "search.resources.gpu: ", f"more than {MAX_GPUS}"),
    ("search: {resources: {gpu: 0.001}}", "search.resources.gpu: ", "finer than 1/64"),
    ("search: {trials: 1000000000}", "search.trials: ", f"at most {MAX_TRIALS}"),
    ("search: {concurrency: 10000000}", "search.concurrency: ", "at most 1024"),
], ids=["seeds", "steps", "tokens", "cpu", "gpu", "gpu_share", "trials", "concurrency"])
def test_every_count_has_a_cap_validate_names(tmp_path, text, where, message):
    proxy, extra = (text, "") if text.startswith("proxy") else (PROXY, text)
    path = yaml_space(tmp_path, proxy=proxy, extra=extra)
    one_line(*bounded("validate", path), f"{path}: {where}", message)


@pytest.mark.parametrize("check, where, cap", [
    ("{n: 1000000000}", "oneshot.check.n: ", f"at most {MAX_CHECK}"),
    ("{seeds: 1000000000}", "oneshot.check.seeds: ", f"at most {MAX_SEEDS}"),
], ids=["check_n", "check_seeds"])
def test_the_one_shot_self_checks_counts_have_caps_validate_names(tmp_path, check, where, cap):
    """The self-check trains n sub-networks × seeds stand-alone: both are counts with a cap."""
    text = (REPO / "spaces" / "oneshot_placement.yaml").read_text()
    path = tmp_path / "oneshot.yaml"
    path.write_text(text.replace("oneshot:\n", f"oneshot:\n  check: {check}\n", 1))
    one_line(*bounded("validate", path), f"{path}: {where}", cap)


def test_cpus_beyond_the_machine_are_a_note_in_validate_and_refused_by_a_local_sweep(tmp_path, capsys):
    cpus = (os.cpu_count() or 1) + 1
    if cpus > MAX_CPUS:
        pytest.skip("a machine with more CPUs than the cap")
    space, out = yaml_space(tmp_path, extra=f"search: {{resources: {{cpu: {cpus}}}}}"), tmp_path / "exp"
    rc, text, err = cli(capsys, "validate", space)
    assert rc == 0 and f"note: search.resources.cpu: {cpus} CPUs per trial is more than this machine's" in text, err
    one_line(*bounded("sweep", space, "--out", out), "search.resources.cpu: ", "(os.cpu_count())", "--engine ray")
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["sweep", "{space}", "--seeds", "1000000"], f"--seeds 1000000: at most {MAX_SEEDS}"),
    (["sweep", "{space}", "--trials", "1000000000"], f"--trials 1000000000: at most {MAX_TRIALS:,}"),
    (["calibrate", "{space}", "--seeds", "1000000"], f"--seeds 1000000: at most {MAX_SEEDS}"),
    (["calibrate", "{space}", "--budgets", "inf"], "--budgets: give positive multiples"),
    (["calibrate", "{space}", "--budgets", "nan"], "--budgets: give positive multiples"),
    (["calibrate", "{space}", "--budgets", "1e30"], "--budgets: 1e+30× the proxy's budget is past 64×"),
    (["calibrate", "{space}", "--budgets", "1,2,1"], "repeats a budget"),
    (["calibrate", "{space}", "--budgets", ",".join(map(str, range(1, 10)))], "9 budgets, at most 8"),
    (["calibrate", "{big}", "--budgets", "2"], f"past the cap of {MAX_STEPS:,}"),
    (["export", "tiny_noloop", "--out", "{out}", "--scale-to", "inf"], "--scale-to: give a finite number"),
    (["export", "tiny_noloop", "--out", "{out}", "--scale-to", "nan"], "--scale-to: give a finite number"),
], ids=["sweep_seeds", "sweep_trials", "calibrate_seeds", "budgets_inf", "budgets_nan", "budgets_1e30",
        "budgets_repeat", "budgets_many", "budgets_steps", "scale_to_inf", "scale_to_nan"])
def test_count_flags_are_one_line(tmp_path, argv, message):
    space = yaml_space(tmp_path)
    big = yaml_space(tmp_path, proxy=PROXY.replace("steps: 4", f"steps: {MAX_STEPS}"), name="big.yaml")
    out = tmp_path / "out"
    argv = [a.format(space=space, big=big, out=out) for a in argv]
    if argv[0] != "export":
        argv += ["--out", out]
    one_line(*bounded(*argv, cwd=tmp_path), message)
    assert not out.exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- 4. calibrate: one candidate


def test_calibrate_refuses_a_one_candidate_space_before_training(tmp_path):
    space, out = yaml_space(tmp_path, params="{target: loop.boundary, choices: [none]}"), tmp_path / "cal"
    one_line(*bounded("calibrate", space, "--out", out), f"{space}: the space has one candidate",
             "nothing to compare")
    assert not out.exists()


def test_calibrate_in_which_every_trial_failed_exits_1_with_the_first_reason(tmp_path, capsys, monkeypatch):
    """Every trial of the calibration failed: no calibration of no values, exit 1 and the
    first reason (the sweep's rule), not exit 0 and a table of dashes."""
    import runners.sweep.run

    def failing(space, out, seeds, planned, **_):  # each trial fails as a worker's exception would
        sweep = Sweep(space, out, "optuna", seeds=seeds, planned=planned)
        while (job := sweep.next_job()) is not None:
            sweep.on_outcome(job.id, {"status": "failed", "reason": "RuntimeError: planted failure"})
        sweep.close()
        return out

    monkeypatch.setattr(runners.sweep.run, "run_sweep", failing)
    space, out = yaml_space(tmp_path), tmp_path / "cal"
    rc, text, err = cli(capsys, "calibrate", space, "--out", out, "--seeds", "2")
    assert rc == 1 and "Traceback" not in text + err, (rc, err)
    last = err.strip().splitlines()[-1]
    assert re.match(rf"error: {re.escape(str(out / 'budget-1x'))}: no trial completed: (\d+) of \1 failed; "
                    r"the first, t0000 \(failed\): replicate 0 \(seed 0\): RuntimeError: planted failure; "
                    r"nothing to calibrate$", last), last
    assert not (out / "calibration.json").exists() and not (out / "calibration.png").exists()


# ---------------------------------------------------------------- 5. Python spaces


@pytest.mark.parametrize("raised", ["SystemExit(3)", "type('Stop', (KeyboardInterrupt,), {})()",
                                    "type('Mine', (BaseException,), {})('boom')", "GeneratorExit()"],
                         ids=["exit", "interrupt_subclass", "base_exception", "generator_exit"])
def test_a_python_space_raising_anything_on_import_is_one_line(tmp_path, raised):
    path = tmp_path / "raises.py"
    path.write_text(f"raise {raised}\n")
    one_line(*bounded("validate", path), f"{path}: importing the space file failed: ")


def test_a_sample_raising_a_base_exception_is_an_infeasible_candidate(tmp_path):
    loaded = load_space(py_space(tmp_path, "def sample(trial, base):\n    raise SystemExit(1)\n"))

    class Trial:
        params: dict = {}

    with pytest.raises(SpecError, match="sample: raised SystemExit"):
        loaded.candidate(Trial())


def test_a_sample_raising_on_its_first_call_is_one_line_before_any_trial(tmp_path):
    space, out = py_space(tmp_path, "def sample(trial, base):\n    return 1 / 0\n"), tmp_path / "exp"
    one_line(*bounded("sweep", space, "--out", out), f"{space}: sample: raised ZeroDivisionError",
             "on its first call, before any trial")
    assert not out.exists()


@pytest.mark.parametrize("body, reason", [
    ('def sample(trial, base):\n    trial.suggest_int("x", 0, 3)\n    return {**base, "modle": {}}\n',
     "unknown field 'modle'"),
    ("CALLS = []\ndef sample(trial, base):\n    CALLS.append(1)\n    if len(CALLS) > 1:\n"
     "        raise ValueError('second call')\n    return base\n", "sample: raised ValueError: second call"),
], ids=["misspelt_key", "raises_later"])
def test_a_sweep_in_which_every_trial_failed_exits_1_with_the_first_reason(tmp_path, capsys, body, reason):
    out = tmp_path / "exp"
    rc, text, err = cli(capsys, "sweep", py_space(tmp_path, body), "--out", out)
    assert rc == 1 and "Traceback" not in text + err, (rc, err)
    last = err.strip().splitlines()[-1]
    # invalid candidates use no budget: the sweep stops after 50 × trials of them in a row
    assert re.match(r"error: no trial completed: (\d+) of \1 failed; the first, t0000 \(infeasible\): "
                    r"invalid spec: ", last), last
    assert reason in last, last


# ---------------------------------------------------------------- 6. a base that is not a spec


@pytest.mark.parametrize("base", ["/proc/self/status", "other_space.yaml"])
def test_a_base_that_is_not_a_spec_is_one_line(tmp_path, base):
    yaml_space(tmp_path, name="other_space.yaml")
    path = yaml_space(tmp_path, base=base)
    one_line(*bounded("validate", path), f"{path}: base: ", "not an architecture spec: none of its")


def test_a_file_that_is_not_a_spec_is_one_line():
    one_line(*bounded("validate", "/proc/self/status"), "/proc/self/status: not an architecture spec")


def test_a_near_spec_keeps_its_field_errors(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("modle: {vocab_size: 256, width: 64}\nnum_layers: 1\nlayer: {mixer: {kind: gdn}}\n")
    rc, _, err = cli(capsys, "validate", path)
    assert rc == 2 and "did you mean 'model'" in err and "not an architecture spec" not in err, err
