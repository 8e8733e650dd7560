"""The search-space language: loading, errors, sampling, constraints (no training)."""
import itertools
import subprocess
import sys
import textwrap

import optuna
import pytest

from nas.errors import SpecError
from nas.space import cost_value, grid_size, load_space, parse_constraint, set_path, spec_hash, violations
from spaces import SPACES, space_names, space_path

BASE = """\
name: t
base: tiny_noloop
params:
  boundary: {target: loop.boundary, choices: [none, block, mixer]}
  T: {target: loop.T, choices: [2, 4], when: {boundary: [block, mixer]}}
objectives:
  - {metric: acc, direction: maximize}
  - {metric: projection_flops, direction: minimize}
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}
"""


def write(tmp_path, text, name="space.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_conditional_parameter_is_sampled_only_when_its_condition_holds(tmp_path):
    space = load_space(write(tmp_path, BASE))
    arch, _, params = space.candidate(optuna.trial.FixedTrial({"boundary": "none"}))
    assert params == {"boundary": "none"} and arch.loops == ()
    arch, _, params = space.candidate(optuna.trial.FixedTrial({"boundary": "mixer", "T": 4}))
    assert params == {"boundary": "mixer", "T": 4}
    assert len(arch.loops) == 2 * 1 and {r.T for r in arch.loops} == {4}  # each layer's mixer
    arch, _, _ = space.candidate(optuna.trial.FixedTrial({"boundary": "block", "T": 2}))
    assert [(r.start.layer, r.end.layer, r.T) for r in arch.loops] == [(0, 1, 2)]


def test_a_study_never_suggests_the_condition_when_it_fails(tmp_path):
    space = load_space(write(tmp_path, BASE))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        _, _, params = space.suggest(trial)
        seen.add(params["boundary"])
        assert ("T" in params) == (params["boundary"] != "none")
        assert set(trial.params) == set(params)
        study.tell(trial, 0.0)
    assert seen == {"none", "block", "mixer"}


def test_ranges_int_float_log_and_proxy_targets(tmp_path):
    space = load_space(write(tmp_path, BASE.replace("params:\n", """params:
  width: {target: model.width, low: 32, high: 96, step: 32}
  lr: {target: proxy.lr, low: 5e-4, high: 1e-2, log: true}
""")))
    assert space.spec.params["width"].kind == "int" and space.spec.params["lr"].kind == "float"
    data, proxy, params = space.suggest(optuna.trial.FixedTrial({"width": 96, "lr": 3e-3, "boundary": "none"}))
    assert data["model"]["width"] == 96 and proxy == {"lr": 3e-3}
    assert grid_size(space) is None  # a log range is continuous


def test_non_scalar_choices_travel_as_labels(tmp_path):
    space = load_space(write(tmp_path, """\
        base: tiny_lt2_interleave
        params:
          ratio: {target: hybrid.ratio, choices: [{attn: 1, gdn: 1}, {attn: 1, gdn: 3}]}
        objectives: [{metric: acc, direction: maximize}]
        proxy: {task: s5, steps: 4}
        """))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    data, _, params = space.suggest(trial)
    assert isinstance(params["ratio"], dict) and data["hybrid"]["ratio"] == params["ratio"]
    assert isinstance(trial.params["ratio"], str)  # Optuna stores the JSON label


def test_hash_identifies_the_canonical_spec(tmp_path):
    space = load_space(write(tmp_path, BASE))
    a, pa, _ = space.candidate(optuna.trial.FixedTrial({"boundary": "none"}))
    b, pb, _ = space.candidate(optuna.trial.FixedTrial({"boundary": "none", "T": 4}))
    c, pc, _ = space.candidate(optuna.trial.FixedTrial({"boundary": "block", "T": 4}))
    assert spec_hash(a, pa) == spec_hash(b, pb) != spec_hash(c, pc)
    assert spec_hash(a, {"lr": 1e-3}) != spec_hash(a, {})


def test_constraints_parse_and_price(tmp_path):
    c = parse_constraint("kv_bytes(seq_len=32768) <= 2e9", "constraints[0]")
    assert (c.metric, c.seq_len, c.op, c.bound) == ("kv_bytes", 32768, "<=", 2e9)
    assert c.violation(1e9) < 0 < c.violation(3e9)
    assert parse_constraint("unique_params >= 10", "x").violation(5) == 5
    space = load_space(write(tmp_path, BASE.replace("objectives:", "constraints: ['unique_params <= 1e5', "
                                                    "'kv_bytes(seq_len=4096) <= 1e9']\nobjectives:")))
    arch, _, _ = space.candidate(optuna.trial.FixedTrial({"boundary": "none"}))
    params = cost_value(arch, "unique_params", 1024)
    [(c1, v1), (c2, v2)] = violations(space, arch)
    assert v1 == params - 1e5 > 0 and v2 < 0


@pytest.mark.parametrize("text, where", [
    (BASE.replace("choices: [2, 4], when: {boundary: [block, mixer]}", "choices: [2, 4], when: {boundry: [block]}"),
     "params.T.when.boundry: did you mean 'boundary'?"),
    (BASE.replace("target: loop.T", "target: lop.T"), "params.T.target: 'lop.T' is not a spec field; did you mean 'loop'?"),
    (BASE.replace("choices: [2, 4]", "low: 4, high: 2"), "params.T"),
    (BASE.replace("base: tiny_noloop", "base: tiny_nolop"), "base: 'tiny_nolop' is neither a file nor a shipped "
                                                             "architecture; did you mean 'tiny_noloop'?"),
    (BASE + "constraints: ['unique_parms <= 3']\n", "constraints[0]: unknown cost metric 'unique_parms'; did you mean"),
    (BASE + "constraints: ['unique_params < three']\n", "constraints[0]: cannot read"),
    (BASE.replace("direction: maximize", "direction: up"), "objectives[0].direction"),
    (BASE + "search: {sampler: tpee}\n", "search.sampler: unknown sampler 'tpee'; did you mean 'tpe'?"),
    (BASE + "search: {early_stopping: {rungs: [3]}}\n", "search.early_stopping.rungs: rung 3 is not a multiple"),
    (BASE + "search: {early_stopping: {rungs: [4]}}\n", "search.early_stopping.rungs: rung 4 is not before the last step"),
    (BASE.replace("maximize}", "maximize}\n  - {metric: eval_loss, direction: minimize}"), "objectives: at most one proxy quality"),
    (BASE.replace("maximize}", "maximize}\n  - {metric: decode_latency_ms, direction: minimize}")
     + "search: {early_stopping: {rungs: [2]}}\n",
     "search.early_stopping: cannot be combined with serving objectives (decode_latency_ms)"),
    (BASE.replace("maximize}", "maximize}\n  - {metric: cache_bytes, direction: minimize}"
                  "\n  - {metric: cache_bytes, direction: minimize}"),
     "objectives[2]: 'cache_bytes' is already objectives[1]"),
    (BASE.replace("maximize}", "maximize}\n  - {metric: unique_params, direction: minimize, batch_size: 4}"),
     "objectives[1].batch_size: batch_size applies to serving metrics"),
    (BASE + "bogus: 1\n", "bogus"),
    (BASE.replace("base: tiny_noloop", "base: {model: {vocab_size: 8, width: -1}, num_layers: 1, "
                                       "layer: {mixer: {kind: gdn}, ffn: {kind: swiglu}}}"), "base.model.width"),
])
def test_bad_spaces_name_the_field(tmp_path, text, where):
    with pytest.raises(SpecError) as info:
        load_space(write(tmp_path, text))
    assert where in str(info.value), str(info.value)


def test_serving_objective_names_carry_context_and_batch():
    from nas.space import ObjectiveSpec
    names = [ObjectiveSpec(metric="decode_latency_ms", direction="minimize", **kw).name
             for kw in ({}, {"seq_len": 4096}, {"seq_len": 4096, "batch_size": 8}, {"batch_size": 8})]
    assert names == ["decode_latency_ms", "decode_latency_ms@4096", "decode_latency_ms@4096/b8",
                     "decode_latency_ms/b8"]


def test_python_space_is_define_by_run(tmp_path):
    path = write(tmp_path, """\
        SPACE = {
            "name": "py",
            "base": "tiny_noloop",
            "objectives": [{"metric": "acc", "direction": "maximize"}],
            "proxy": {"task": "s5", "steps": 4},
        }

        def sample(trial, base):
            boundary = trial.suggest_categorical("boundary", ["none", "mixer"])
            if boundary != "none":
                base["loop"] = {"boundary": boundary, "T": trial.suggest_int("T", 2, 3)}
            return base
        """, "space.py")
    space = load_space(path)
    arch, _, params = space.candidate(optuna.trial.FixedTrial({"boundary": "mixer", "T": 3}))
    assert params == {"boundary": "mixer", "T": 3} and {r.T for r in arch.loops} == {3}
    broken = write(tmp_path, "SPACE = {}\n", "broken.py")
    with pytest.raises(SpecError, match="defines SPACE"):
        load_space(broken)


def test_set_path_creates_and_deletes():
    data = {"loop": {"boundary": "none"}}
    set_path(data, "hybrid.ratio.attn", 1)
    set_path(data, "loop.boundary", None)
    assert data == {"loop": {}, "hybrid": {"ratio": {"attn": 1}}}


@pytest.mark.parametrize("name", space_names())
def test_shipped_spaces_load_and_every_grid_point_is_a_valid_spec(name):
    from runners.sweep.study import grid_values

    space = load_space(space_path(name))
    if space.spec.oneshot is not None:  # its points: every placement at every loop count
        from nas import oneshot

        for pattern in oneshot.exhaustive(oneshot.counts(space)):
            for k in oneshot.loop_choices(space):
                params = oneshot.trial_params(space, pattern, k)
                arch, _, got = space.candidate(optuna.trial.FixedTrial(params))
                assert arch.is_canonical and got == params and arch.loops[0].T == k
        return
    assert space.spec.objectives and space.spec.params
    grid = grid_values(space)
    for combo in itertools.product(*grid.values()):
        arch, _, _ = space.candidate(optuna.trial.FixedTrial(dict(zip(grid, combo))))
        assert arch.is_canonical


def test_shipped_define_by_run_space_samples_valid_specs():
    space = load_space(SPACES / "hybrid_define_by_run.py")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(25):
        trial = study.ask()
        arch, _, params = space.candidate(trial)
        seen.add((params["full_layers"] > 0, params["T"] > 1))
        study.tell(trial, 0.0)
    assert seen == {(False, False), (False, True), (True, False), (True, True)}


def test_validate_accepts_spaces_without_importing_torch(tmp_path):
    path = write(tmp_path, BASE)
    code = ("import sys; from runners.cli import main; rc = main(['validate', %r]); "
            "assert 'torch' not in sys.modules and 'optuna' not in sys.modules and 'ray' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'optuna', 'ray'))[:3]; sys.exit(rc)" % str(path))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "space t: 2 parameters (6 grid points)" in run.stdout
    bad = write(tmp_path, BASE.replace("target: loop.T", "target: lop.T"), "bad.yaml")
    run = subprocess.run([sys.executable, "-m", "runners", "validate", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [f"error: {bad}: params.T.target: 'lop.T' is not a spec field; "
                                               "did you mean 'loop'? targets start with a spec field (model, "
                                               "layer, loop, hybrid, elastic, ...) or 'proxy.'"]


def test_match_resizes_every_candidate_to_the_same_parameters(tmp_path):
    space = load_space(write(tmp_path, BASE.replace("objectives:", "match: {unique_params: 100000, "
                                                    "vary: ffn_hidden, tolerance: 0.01}\nobjectives:")))
    sizes = []
    for params in ({"boundary": "none"}, {"boundary": "block", "T": 4}, {"boundary": "mixer", "T": 2}):
        arch, _, _ = space.candidate(optuna.trial.FixedTrial(params))
        sizes.append(cost_value(arch, "unique_params", 1024))
    assert all(abs(n / 100000 - 1) <= 0.01 for n in sizes), sizes
