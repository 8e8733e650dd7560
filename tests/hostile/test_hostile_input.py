"""Hostile and careless input (issue #20): every bad spec or space is one line naming the
field or path, exit code 2, no traceback; nothing is written outside the chosen output;
``validate``, ``show``, ``cost`` and ``graph`` finish in bounded time and memory; the
torch-free tables in :mod:`nas.proxy` stay equal to the code they mirror."""
import dataclasses
import inspect
import json
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nas.errors import SpecError
from nas.load import MAX_BYTES
from nas.proxy import (
    PROXY_ONLY, SAMPLER_PARAMS, TASK_METRICS, TASK_PARAMS, ProxySpec,
    task_metrics,
)
from nas.space import MAX_GRID, grid_points, load_space
from nas.spec import MAX_LAYERS, named_path
from runners.cli import main
from helpers import REPO, cli, one_line

MEMORY = 500 << 20  # address space of one command
SECONDS = 5

SPEC = """\
name: {name}
model: {{vocab_size: 256, width: 64}}
num_layers: 1
layer: {{mixer: {{kind: gdn}}, ffn: {{kind: swiglu}}}}
"""
OBJECTIVES = "objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]"
PROXY = "proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}"


def space(params: str = "boundary: {target: loop.boundary, choices: [none, block]}", *,
          objectives: str = OBJECTIVES, proxy: str = PROXY, extra: str = "") -> str:
    return (f"name: hostile\nbase: tiny_noloop\nparams:\n  {params}\n{objectives}\n{proxy}\n{extra}\n")


def write(tmp_path: Path, text: str | bytes, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path






def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bounded(*argv, cwd: Path = REPO, seconds: float = SECONDS) -> tuple[int, str, str]:
    """``loopnas ARGV`` in a subprocess under :data:`MEMORY` of address space; it must end
    within ``seconds`` of CPU time, start-up included (CPU, not wall time: a shared
    machine stretches the second, not the first). The times are printed (``pytest -s``)."""
    start, wall = _cpu(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runners", *map(str, argv)], capture_output=True,
                          text=True, cwd=cwd, timeout=120, preexec_fn=_limits)
    cpu, wall = _cpu() - start, time.monotonic() - wall
    print(f"loopnas {' '.join(map(str, argv))}: {cpu:.2f} s CPU, {wall:.2f} s wall")
    assert cpu < seconds, f"{cpu:.1f} s of CPU"
    assert "MemoryError" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


# ---------------------------------------------------------------- names become paths


HOSTILE_NAMES = ['"../escape"', '"/tmp/abs"', '""', '"a\\0b"', "x" * 300, '"[/b]"', '"a/b"', '"."', '".."',
                 '"-rf"', '"two words"']


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_a_name_that_is_not_one_path_piece_is_refused(tmp_path, capsys, name):
    path = write(tmp_path, SPEC.format(name=name), "spec.yaml")
    for command in ("validate", "show", "cost"):
        one_line(*cli(capsys, command, path), f"{path}: name: ")
    one_line(*cli(capsys, "validate", write(tmp_path, space().replace("hostile", name))), ": name: ")


def test_graph_writes_nothing_outside_the_working_directory(tmp_path):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    path = write(tmp_path, SPEC.format(name='"../../escape"'), "spec.yaml")
    one_line(*bounded("graph", path, cwd=work), "name: ")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "spec.yaml"]


def test_a_long_name_is_shortened_to_a_file_name(tmp_path):
    name = "n" * 255
    rc, out, err = bounded("graph", write(tmp_path, SPEC.format(name=name), "spec.yaml"), cwd=tmp_path)
    assert rc == 0, err
    [png] = tmp_path.glob("*.png")
    assert len(png.name) <= 255 and png.name.startswith("n" * 200)


@pytest.mark.parametrize("name", ["../x", "/abs", "", "a\0b", "\ud800", "x" * 300, "..", ".", "a/../../b"])
def test_named_path_never_leaves_its_folder(name):
    with pytest.raises(SpecError) as info:
        named_path("runs", name, ".png")
    assert info.value.problems[0].path == "name"
    str(info.value).encode()  # printable: no lone surrogate in the message


def test_named_path_keeps_within_the_file_name_limit():
    assert named_path("runs", "quickstart") == Path("runs/quickstart")
    long = named_path(Path("runs"), "é" * 255, ".png")
    assert long.parent == Path("runs") and len(long.name.encode()) <= 255 and long.suffix == ".png"
    assert long != named_path(Path("runs"), "é" * 254 + "e", ".png")  # the hash keeps them apart


def test_default_sweep_directory_is_under_runs(tmp_path):
    from runners.sweep.driver import default_out

    loaded = load_space(write(tmp_path, space()))
    assert default_out(loaded) == Path("runs") / "hostile"


# ---------------------------------------------------------------- unbounded memory


def laughs(depth: int = 9) -> str:
    """Billion laughs: ten to the ``depth`` strings from a few hundred bytes."""
    lines = ["    l0: &l0 [ha, ha, ha, ha, ha, ha, ha, ha, ha, ha]"]
    for i in range(1, depth):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines)


@pytest.mark.parametrize("where", ["proxy", "choices", "sampler_params"])
def test_alias_bombs_are_refused_in_bounded_memory(tmp_path, where):
    bomb = laughs()
    if where == "proxy":
        text = space(proxy=f"proxy:\n  task: s5\n  steps: 4\n  extra:\n{bomb}")
    elif where == "choices":
        text = space(f"boundary: {{target: loop.boundary, choices: [none]}}\n  lol:\n    target: model.width\n"
                     f"    choices:\n    - bomb:\n{textwrap.indent(bomb, '    ')}")
    else:
        text = space(extra=f"search:\n  sampler: tpe\n  sampler_params:\n    bomb:\n{textwrap.indent(bomb, '  ')}")
    path = write(tmp_path, text)
    one_line(*bounded("validate", path), f"{path}: ", "aliases expand")


def test_an_alias_cycle_is_refused(tmp_path, capsys):
    path = write(tmp_path, space(proxy="proxy: &p {task: s5, steps: 4, me: *p}"))
    one_line(*cli(capsys, "validate", path), f"{path}: ", "alias to itself")


def test_aliases_within_budget_still_load(tmp_path, capsys):
    layer = "&l {mixer: {kind: gdn}, ffn: {kind: swiglu}}"
    path = write(tmp_path, f"model: {{vocab_size: 256, width: 64}}\nlayers: [{layer}, *l, *l]\n", "spec.yaml")
    rc, out, err = cli(capsys, "validate", path)
    assert rc == 0 and "3 layers" in out, err


@pytest.mark.parametrize("count, message", [(MAX_LAYERS + 1, f"at most {MAX_LAYERS} items"),
                                            (200_000, "aliases expand")])
def test_explicit_layers_are_capped_like_num_layers(tmp_path, count, message):
    layer = "&l {mixer: {kind: gdn}, ffn: {kind: swiglu}}"
    text = f"model: {{vocab_size: 256, width: 64}}\nlayers: [{layer}" + ", *l" * (count - 1) + "]\n"
    path = write(tmp_path, text, "spec.yaml")
    for command in ("validate", "show", "cost"):
        one_line(*bounded(command, path), f"{path}: ", message)


def test_an_oversized_document_is_refused_before_parsing(tmp_path):
    line = "- {mixer: {kind: gdn}, ffn: {kind: swiglu}}\n"
    path = write(tmp_path, "model: {vocab_size: 256, width: 64}\nlayers:\n" + line * 200_000, "spec.yaml")
    one_line(*bounded("validate", path), f"{path}: ", "larger than any")


def test_the_largest_document_allowed_validates_in_bounded_time(tmp_path):
    choices = ",".join(["64"] * 340_000)  # just under MAX_BYTES, a node per two bytes
    path = write(tmp_path, space(f"w: {{target: model.width, choices: [{choices}]}}"))
    assert MAX_BYTES - 30_000 < path.stat().st_size < MAX_BYTES
    rc, out, err = bounded("validate", path)
    assert rc == 0 and out.startswith("ok  "), err


BIG = """\
name: big_{loop}
model:
  vocab_size: 256
  width: 64
  defaults:
    attn: {{num_heads: 4, num_kv_heads: 2, output_gate: true}}
    gdn: {{num_heads: 2, head_dim: 32, expand_v: 1}}
    swiglu: {{hidden_size: 128}}
num_layers: {layers}
{stack}
loop: {sugar}
"""
HYBRID = "hybrid: {ratio: {attn: 1, gdn: 3}, placement: interleave}"
BIG_LOOPS = {  # the most regions; a loop with parts; a schedule entry per mixer and iteration
    "mixer": (HYBRID, "{boundary: mixer, T: 4, update: {kind: residual_gate, shared: true}}"),
    "elr": (HYBRID, "{boundary: elr, prelude: 100, recurrent: 3896, coda: 100, T: 4, update: {kind: gated_step}, "
                    "conditioning: index_budget}"),
    "coarse_to_fine": ("layer: {mixer: {kind: attn}, ffn: {kind: swiglu}}",
                       "{boundary: block, T: 4, update: {kind: residual_gate}, windows: [full, 32, 16, 8]}"),
}
BIG_SECONDS = 20  # of CPU: generous for a shared CI machine; a quiet one takes under 5 (printed)
PENDING = {  # quadratic outside the files this test was written with, and the fix each needs
}


def _big_cases():
    for loop in BIG_LOOPS:
        for command in ("validate", "show", "cost", "graph.dot", "graph.png"):
            where, reason = PENDING.get(command, (None, ""))
            marks = pytest.mark.xfail(run=False, reason=reason) if where in (loop, "*") else ()
            yield pytest.param(loop, command, marks=marks, id=f"{loop}-{command}")


@pytest.mark.parametrize("loop, command", list(_big_cases()))
def test_the_largest_spec_allowed_runs_in_bounded_time(tmp_path, loop, command):
    stack, sugar = BIG_LOOPS[loop]
    path = write(tmp_path, BIG.format(loop=loop, layers=MAX_LAYERS, stack=stack, sugar=sugar), "big.yaml")
    name, _, suffix = command.partition(".")
    argv = [name, path] + (["--out", tmp_path / f"big.{suffix}"] if suffix else [])
    rc, out, err = bounded(*argv, cwd=tmp_path, seconds=BIG_SECONDS)
    assert rc == 0 and "Traceback" not in err, err
    if name == "validate":
        assert out.startswith("ok  ") and f"{MAX_LAYERS} layers" in out, out
    if suffix:
        assert (tmp_path / f"big.{suffix}").stat().st_size > 0


def test_a_huge_grid_is_counted_not_listed(tmp_path, capsys):
    params = ("a: {target: model.width, low: 1, high: 1000000}\n"
              "  b: {target: model.vocab_size, low: 1, high: 1000000}")
    path = write(tmp_path, space(params, extra="search: {sampler: grid}"))
    one_line(*cli(capsys, "validate", path), f"{path}: search.sampler: ", "1,000,000,000,000 points")
    tiny = write(tmp_path, space("lr: {target: proxy.lr, low: 0.001, high: 0.01, step: 1.0e-300}",
                                 extra="search: {sampler: grid}"), "tiny.yaml")
    one_line(*cli(capsys, "validate", tiny), f"{tiny}: search.sampler: ", "about 10^")


def test_the_driver_grid_refuses_before_listing(tmp_path):
    from runners.sweep.study import SweepError, grid_values

    params = "a: {target: model.width, low: 1, high: 1000000000000}"
    loaded = load_space(write(tmp_path, space(params)))  # tpe: a range is fine
    assert grid_points(loaded.spec) > MAX_GRID
    start = time.perf_counter()
    with pytest.raises(SweepError, match="cannot be listed"):
        grid_values(loaded)
    assert time.perf_counter() - start < 1


# ---------------------------------------------------------------- validate names what sweep would find


BAD_SPACES = {
    "unknown_metric": (dict(objectives="objectives: [{metric: accuracy, direction: maximize}]"),
                       "objectives[0].metric: ", "reports no metric 'accuracy'"),
    "lm_has_no_acc": (dict(proxy="proxy: {task: lm, task_params: {data_files: x.txt}, steps: 4}"),
                      "objectives[0].metric: ", "reports no metric 'acc'"),
    "no_such_field": (dict(params="w: {target: model.no_such_field, choices: [1]}"),
                      "params.w.target: ", "'no_such_field' is not a field of model"),
    "dunder_target": (dict(params="w: {target: model.__dict__, choices: [1]}"),
                      "params.w.target: ", "'__dict__' is not a field of model"),
    "below_a_value": (dict(params="w: {target: model.width.x, choices: [1]}"),
                      "params.w.target: ", "is a value"),
    "proxy_target": (dict(params="w: {target: proxy.lrr, choices: [0.1]}"),
                     "params.w.target: ", "did you mean 'lr'"),
    "proxy_value": (dict(params="lr: {target: proxy.lr, choices: [0.01, -1]}"),
                    "params.lr.choices[1]: ", "proxy.lr"),
    "task_param_target": (dict(params="d: {target: proxy.task_params.degree, choices: [3, 9]}"),
                          "params.d.choices[1]: ", "degree must be in 2..6"),
    "nan_bound": (dict(params="w: {target: model.width, low: .nan, high: 64}"), "params.w: ", "finite"),
    "inf_bound": (dict(params="lr: {target: proxy.lr, low: 0.001, high: .inf}"), "params.lr: ", "finite"),
    "infinite_span": (dict(params="x: {target: proxy.lr, low: -1.0e308, high: 1.0e308, step: 1.0e307}"),
                      "params.x: ", "overflows"),
    "inf_cpu": (dict(extra="search: {resources: {cpu: .inf}}"), "search.resources.cpu: ", "finite"),
    "inf_timeout": (dict(extra="search: {trial_timeout: .inf}"), "search.trial_timeout: ", "finite"),
    "sampler_param": (dict(extra="search: {sampler: tpe, sampler_params: {n_startup: 3}}"),
                      "search.sampler_params.n_startup: ", "did you mean 'n_startup_trials'"),
    "sampler_constraints": (dict(extra="search: {sampler: nsga2, sampler_params: {constraints_func: x}}"),
                            "search.sampler_params.constraints_func: ", "the sweep records on each trial"),
    "sampler_class": (dict(extra="search: {sampler: FooSampler}"), "search.sampler: ", "unknown sampler"),
    "proxy_typo": (dict(proxy="proxy: {task: s5, steps: 4, batch_sise: 4}"), "proxy.batch_sise: ",
                   "unknown field"),
    "proxy_steps": (dict(proxy="proxy: {task: s5}"), "proxy: ", "set steps or tokens"),
    "proxy_min_lr": (dict(proxy="proxy: {task: s5, steps: 4, lr: 0.0001}"), "proxy: ", "min_lr"),
    "unknown_task": (dict(proxy="proxy: {task: s55, steps: 4}"), "proxy.task: ", "did you mean 's5'"),
    "task_param_name": (dict(proxy="proxy: {task: s5, steps: 4, task_params: {degre: 3}}"),
                        "proxy.task_params.degre: ", "unknown field"),
    "task_param_value": (dict(proxy="proxy: {task: s5, steps: 4, task_params: {degree: 9}}"),
                         "proxy.task_params: ", "degree must be in 2..6"),
    "task_param_type": (dict(proxy="proxy: {task: s5, steps: 4, task_params: {seq_len: '8'}}"),
                        "proxy.task_params.seq_len: ", "integer"),
    "mqar_pairs": (dict(proxy="proxy: {task: mqar, steps: 4, task_params: {vocab_size: 16, num_kv_pairs: 9}}"),
                   "proxy.task_params: ", "num_kv_pairs"),
    "extrapolate": (dict(proxy="proxy: {task: s5, steps: 4, extrapolate: [{sequence: 8}]}"),
                    "proxy.extrapolate[0].sequence: ", "unknown field"),
    "curriculum_sets_n": (dict(objectives="objectives: [{metric: n_max, direction: maximize}]",
                               proxy="proxy: {task: state_tracking, steps: 4, curriculum: {}, task_params: {n: 4}}"),
                          "proxy.task_params: ", "set by the curriculum"),
    "storage_not_url": (dict(extra="search: {storage: 'not a url'}"), "search.storage: ", "not a database URL"),
    "storage_dialect": (dict(extra="search: {storage: 'postgres://u@h/db'}"), "search.storage: ",
                        "did you mean 'postgresql'"),
    "storage_dir": (dict(extra="search: {storage: 'sqlite:///no/such/dir/x.db'}"), "search.storage: ",
                    "no directory 'no/such/dir'"),
    "storage_driver": (dict(extra="search: {storage: 'mysql+nosuchdriver://u@h/db'}"), "search.storage: ",
                       "'nosuchdriver' is not installed"),
    "storage_memory": (dict(extra="search: {storage: 'sqlite://'}"), "search.storage: ", "in-memory"),
    "seq_len_arabic": (dict(extra="seq_len: '١٢٣'"), "seq_len: ", "integer"),
    "seq_len_huge": (dict(extra="seq_len: " + "9" * 4000), "seq_len: ", "at most"),
    "seq_len_5000_digits": (dict(extra="seq_len: " + "9" * 5000), "", "malformed YAML: a number with more"),
    "constraint_superscript": (dict(extra="constraints: ['kv_bytes(seq_len=²) <= 1e9']"), "constraints[0]: ",
                               "seq_len=<int>"),
    "constraint_digits": (dict(extra=f"constraints: ['kv_bytes(seq_len={'9' * 5000}) <= 1e9']"),
                          "constraints[0]: ", "seq_len=<int>"),
    "constraint_inf": (dict(extra="constraints: ['unique_params <= 1e999']"), "constraints[0]: ", "finite"),
    "objective_seq_len": (dict(objectives="objectives: [{metric: kv_bytes, seq_len: 0, direction: minimize}]"),
                          "objectives[0].seq_len: ", "greater than 0"),
}


@pytest.mark.parametrize("case", BAD_SPACES, ids=list(BAD_SPACES))
def test_validate_names_what_sweep_would_find(tmp_path, capsys, case):
    kwargs, where, message = BAD_SPACES[case]
    path = write(tmp_path, space(**kwargs))
    one_line(*cli(capsys, "validate", path), f"error: {path}: {where}", message)


@pytest.mark.parametrize("train, where, message", [
    ("{stepz: 3}", "oneshot.train.stepz: ", "unknown field"),
    ("{seeds: 2}", "oneshot.train.seeds: ", "set it in proxy"),
    ("{task_params: {vocab_size: 64, seq_len: 32, num_kv_pairs: 40}}", "oneshot.train.task_params: ", "num_kv_pairs"),
])
def test_supernet_settings_are_checked_by_validate(tmp_path, capsys, train, where, message):
    text = (REPO / "spaces" / "oneshot_placement.yaml").read_text()
    path = write(tmp_path, text.replace("oneshot:\n", f"oneshot:\n  train: {train}\n"))
    one_line(*cli(capsys, "validate", path), f"error: {path}: {where}", message)


def test_base_at_a_binary_file(tmp_path, capsys):
    blob = write(tmp_path, bytes(range(256)) * 4, "blob.yaml")
    path = write(tmp_path, space().replace("base: tiny_noloop", f"base: {blob}"))
    one_line(*cli(capsys, "validate", path), str(blob), "not UTF-8")
    big = write(tmp_path, b"a: 1\n" * 300_000, "big.yaml")
    path = write(tmp_path, space().replace("base: tiny_noloop", f"base: {big}"), "big_space.yaml")
    one_line(*cli(capsys, "validate", path), str(big), "larger than any")


def test_a_good_space_still_validates(tmp_path, capsys):
    rc, out, err = cli(capsys, "validate", write(tmp_path, space(extra="search: {storage: 'sqlite:///x.db'}")))
    assert rc == 0 and out.startswith("ok  ") and not err, err


# ---------------------------------------------------------------- Python spaces, markup


def test_exit_code_is_the_worst_of_all_files(tmp_path, capsys):
    bad = write(tmp_path, SPEC.format(name='"../x"'), "bad.yaml")
    exits = write(tmp_path, "import sys\nsys.exit(0)\n", "exits.py")
    good = REPO / "spaces" / "archs" / "tiny_noloop.yaml"
    for order in ((bad, exits), (exits, bad), (good, exits)):
        rc, out, err = cli(capsys, "validate", *order)
        assert rc == 2 and "Traceback" not in err, (rc, err)
        assert f"error: {exits}: importing the space file failed: SystemExit" in err
    rc, out, err = bounded("validate", exits, good)
    assert rc == 2 and len(err.splitlines()) == 1 and out.startswith(f"ok  {good}"), (rc, out, err)


def test_a_raising_sample_is_an_infeasible_candidate(tmp_path):
    path = write(tmp_path, textwrap.dedent("""\
        SPACE = {"base": "tiny_noloop", "objectives": [{"metric": "acc", "direction": "maximize"}],
                 "proxy": {"task": "s5", "steps": 4}}
        def sample(trial, base):
            return 1 / 0
        """), "raises.py")
    loaded = load_space(path)

    class Trial:
        params: dict = {}

    with pytest.raises(SpecError) as info:
        loaded.candidate(Trial())
    assert [p.path for p in info.value.problems] == ["sample"]
    assert "ZeroDivisionError" in str(info.value) and len(str(info.value).splitlines()) == 1


def test_markup_in_paths_is_printed_verbatim(tmp_path, capsys):
    good = write(tmp_path, SPEC.format(name="plain"), "x[/b]y[bold red].yaml")
    rc, out, err = cli(capsys, "validate", good)
    assert rc == 0 and f"ok  {good}  (plain: 1 layers" in out, (out, err)
    bad = write(tmp_path, "model: [", "[/b]bad[/].yaml")
    one_line(*cli(capsys, "validate", bad), f"error: {bad}: malformed YAML")
    rc, out, err = cli(capsys, "graph", good, "--out", tmp_path / "[/b]" / "g[/i].dot")
    assert rc == 0 and f"wrote {tmp_path / '[/b]' / 'g[/i].dot'}" in out, err


def test_a_path_that_is_not_utf8_is_printed(tmp_path):
    one_line(*bounded("validate", tmp_path / "\udcff.yaml"), "no such file")


def test_graph_out_under_a_file(tmp_path, capsys):
    spec = write(tmp_path, SPEC.format(name="plain"), "spec.yaml")
    one_line(*cli(capsys, "graph", spec, "--out", spec / "g.dot"), "--out ", "cannot write")


@pytest.mark.parametrize("option", [["--seq-len", "1" + "0" * 36], ["--seq-len", "9" * 5000], ["--seq-len", "0"],
                                    ["--tokens", "1e400"], ["--tokens", "nan"], ["--tokens", "-1"]],
                         ids=["seq_len_1e36", "seq_len_5000_digits", "seq_len_0", "tokens_inf", "tokens_nan", "tokens_neg"])
def test_cost_options_out_of_range(capsys, option):
    rc, out, err = cli(capsys, "cost", "tiny_elr", *option)
    if option[1] == "9" * 5000:  # not an integer to click: its usage error (usage, hint, one error line)
        assert rc == 2 and "Traceback" not in err and "Invalid value for '--seq-len'" in err, err
    else:
        one_line(rc, out, err, f"error: {option[0]} must be")


# ---------------------------------------------------------------- markup in what commands print

MARKUP = "[/bold]a[red]b[/]c[/i]"  # a closing tag that opens nothing: MarkupError if read as markup


def markup_experiment(root: Path) -> Path:
    """An experiment directory whose every printed string holds markup: its name, a trial's
    summary (a real one: an ELR summary's inner spans are ``[layers 1–2 ...]``), devices,
    the reasons of a failed and an out-of-memory trial, parameter values."""
    from nas.cost import cost
    from nas.graph import summary
    from nas.load import load_arch
    from runners.results.records import ExperimentRecord, Objective, Point, TrialRecord, write_json

    objectives = [Objective(name="acc", direction="maximize", measured=True),
                  Objective(name="projection_flops", direction="minimize", measured=False)]
    (root / "trials").mkdir(parents=True)
    write_json(root / "experiment.json", ExperimentRecord(
        name=MARKUP, space={"name": MARKUP}, objectives=objectives, engine=f"optuna{MARKUP}", trials=4,
        created=0.0, seq_len=256))
    trials = []
    for n, name in enumerate(("tiny_noloop", "tiny_elr")):
        arch = load_arch(REPO / "spaces" / "archs" / f"{name}.yaml")
        sheet = cost(arch, seq_len=256).to_dict()
        trials.append(TrialRecord(
            id=f"t{n:04d}", number=n, status="complete", arch=arch.model_dump(mode="json"), cost=sheet,
            summary=f"{summary(arch)} [layers 1–2 ×3 (gated step)] {MARKUP}", params={"act": MARKUP},
            points=[Point(values={"acc": 0.5 + 0.1 * n, "projection_flops": sheet["projection_flops_per_token"]})],
            devices=[f"cpu{MARKUP}"]))
    trials += [TrialRecord(id="t0002", number=2, status="failed", reason=f"ValueError: {MARKUP}"),
               TrialRecord(id="t0003", number=3, status="oom", reason=f"CUDA out of memory {MARKUP}")]
    for t in trials:
        write_json(root / "trials" / f"{t.id}.json", t)
    return root


@pytest.fixture
def wide(monkeypatch):
    """Consoles wide enough that no table cell wraps (the texts are looked for whole)."""
    from runners.cli import bench, common
    for console in (common.console, bench.literal):
        monkeypatch.setattr(console, "_width", 1000)


def no_markup_error(rc: int, out: str, err: str, *literal: str, code: int = 0) -> None:
    assert rc == code and "Traceback" not in out + err and "MarkupError" not in out + err, (rc, out, err)
    for text in literal:
        assert text in out, (text, out)


def test_status_and_report_print_markup_literally(tmp_path, capsys, wide):
    exp = markup_experiment(tmp_path / f"exp{MARKUP}")
    rc, out, err = cli(capsys, "status", exp)
    no_markup_error(rc, out, err, f"{MARKUP} (optuna{MARKUP}, 4 trials requested): 2 complete · 1 failed · 1 oom",
                    f"cpu{MARKUP}: 2", "[layers 1–2 ×3 (gated step)]", f"t0002 failed: ValueError: {MARKUP}",
                    f"t0003 oom: CUDA out of memory {MARKUP}")
    assert out.count(MARKUP) >= 6, out
    rc, out, err = cli(capsys, "status", exp, "--json")
    assert rc == 0 and json.loads(out)["oom"] == 1, err
    rc, out, err = cli(capsys, "report", exp)
    no_markup_error(rc, out, err, f"{MARKUP}: 2 complete, 1 failed, 1 oom", f"report: {exp / 'report' / 'index.html'}",
                    "[layers 1–2 ×3 (gated step)]")


def test_sweep_prints_markup_in_its_paths_literally(tmp_path, capsys, wide, monkeypatch):
    import runners.sweep.run

    exp = markup_experiment(tmp_path / f"exp{MARKUP}")
    monkeypatch.setattr(runners.sweep.run, "run_sweep", lambda *a, **k: exp)  # the sweep ran: what it prints
    rc, out, err = cli(capsys, "sweep", write(tmp_path, space()), "--out", exp)
    no_markup_error(rc, out, err, f"t0003 oom: CUDA out of memory {MARKUP}",
                    f"experiment: {exp}   report: {exp / 'report' / 'index.html'}   (loopnas status {exp} · ")


def test_train_prints_a_failure_reason_literally(tmp_path, capsys, wide, monkeypatch):
    import runners.train
    from nas.load import load_arch

    arch = load_arch(REPO / "spaces" / "archs" / "tiny_noloop.yaml")
    result = runners.train.TrainResult(status="failed", reason=f"KeyError: '{MARKUP}'", task="mqar", steps=1,
                                       tokens=8, params=1, quality_metric="acc", higher_is_better=True,
                                       final={f"acc{MARKUP}": 0.25}, arch=arch)
    monkeypatch.setattr(runners.train, "train", lambda *a, **k: result)
    rc, out, err = cli(capsys, "train", "tiny_noloop", "--task", "mqar", "--steps", "1")
    no_markup_error(rc, out, err, f"tiny_noloop on mqar: failed (KeyError: '{MARKUP}')", f"acc{MARKUP}", code=1)


def test_bench_prints_device_names_errors_and_paths_literally(tmp_path, capsys, wide, monkeypatch):
    import runners.bench
    from runners.bench.run import BenchResult, BenchRow

    row = dict(context=16, batch_size=1, train_tokens_per_s=None, train_step_ms=None, train_mfu=None,
               train_peak_memory_bytes=None, prefill_tokens_per_s=None, prefill_ms=None, decode_tokens_per_s=None,
               decode_ms_per_token=None, peak_memory_bytes=None, cache_kv_bytes=None, cache_state_bytes=0,
               cost_kv_bytes=0, cost_state_bytes=0, error=f"out of memory {MARKUP}")
    result = BenchResult(spec="tiny_noloop", device="cpu", device_name=f"x86{MARKUP}", backend="torch",
                         serving_backend=None, dtype="fp32", loops=None, torch="2", threads=1, repeats=1,
                         decode_tokens=1, memory_method=f"profiler {MARKUP}", peak_flops=1e9,
                         rows=[BenchRow.model_validate(row)],
                         limits=[{"batch_size": 1, "fits": None, "fails": 16, "peak_at_fit": None,
                                  "reason": f"stopped {MARKUP}"}])
    monkeypatch.setattr(runners.bench, "bench", lambda *a, **k: result)
    out_dir = tmp_path / f"b{MARKUP}"
    rc, out, err = cli(capsys, "bench", "tiny_noloop", "--out", out_dir)
    no_markup_error(rc, out, err, f"(x86{MARKUP})", f"batch 1, context 16: out of memory {MARKUP}",
                    f"stopped {MARKUP}", f"peak memory: profiler {MARKUP}",
                    f"wrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'}")


# ---------------------------------------------------------------- tables equal their code


def test_proxy_mirrors_the_trainer_config():
    from runners.train import CurriculumConfig, TrainConfig

    trainer = {n: f.default_factory() if f.default_factory else f.default for n, f in TrainConfig.model_fields.items()}
    proxy = {n: f.default_factory() if f.default_factory else f.default for n, f in ProxySpec.model_fields.items()}
    assert set(proxy) - set(PROXY_ONLY) == set(trainer)
    assert {n: proxy[n] for n in trainer} == trainer
    assert ProxySpec().seeds == 1


def _constructor_defaults(factory) -> dict:
    if dataclasses.is_dataclass(factory):
        return {f.name: f.default for f in dataclasses.fields(factory)}
    return {n: p.default for n, p in inspect.signature(factory).parameters.items()}


def test_task_params_mirror_the_task_constructors():
    from runners.tasks import task_names
    from runners.tasks.base import _REGISTRY

    assert sorted(TASK_PARAMS) == sorted(task_names()) == sorted(TASK_METRICS)
    for name, params in TASK_PARAMS.items():
        real = _constructor_defaults(_REGISTRY[name])
        assert {n: f.default for n, f in params.model_fields.items()} == real, name


@pytest.mark.parametrize("task, params", [
    ("s5", {}), ("s5", {"degree": 7}), ("s5", {"seq_len": 0}), ("s5", {"degree": 1}),
    ("state_tracking", {}), ("state_tracking", {"m": 3}), ("state_tracking", {"m": 300}),
    ("state_tracking", {"n": 0}), ("mqar", {}), ("mqar", {"vocab_size": 16, "num_kv_pairs": 8}),
    ("mqar", {"vocab_size": 16, "num_kv_pairs": 7, "seq_len": 28}), ("mqar", {"seq_len": 8, "num_kv_pairs": 3}),
    ("mqar", {"power_a": 0.0}), ("mqar", {"zoology": False, "vocab_size": 16, "num_kv_pairs": 8, "seq_len": 32}),
    ("lm", {}), ("lm", {"data_files": "a.txt", "dataset": "x"}), ("lm", {"dataset": "x", "eval_fraction": 1.0}),
    ("lm", {"dataset": "x", "streaming": True}), ("lm", {"dataset": "x", "sample_by": "word"}),
    ("hop_induction", {}), ("hop_induction", {"n": 1}), ("hop_induction", {"alphabet_size": 2}),
    ("hop_induction", {"k": "mixed"}), ("hop_induction", {"k": "all"}), ("hop_induction", {"k": [1, 5]}),
    ("hop_induction", {"k": []}), ("hop_induction", {"max_k": 0, "k": 1}),
    ("pointer_chase", {}), ("pointer_chase", {"num_nodes": 4}), ("pointer_chase", {"num_queries": 9}),
    ("pointer_chase", {"num_queries": 0}), ("pointer_chase", {"k": [2, 3], "max_k": 3}),
])
def test_task_param_rules_agree_with_the_tasks(task, params):
    """Both accept or both refuse (the LM task refuses a corpus it cannot read later on)."""
    from pydantic import ValidationError

    from runners.tasks import make_task

    try:
        TASK_PARAMS[task].model_validate(params)
        mirror = True
    except ValidationError:
        mirror = False
    try:
        make_task(task, **params)
        real = True
    except (TypeError, ValueError):
        real = False
    except Exception:  # past the checks: the LM corpus is not there
        real = True
    assert mirror == real, (task, params)


def test_task_metrics_are_what_each_task_reports(tmp_path):
    import torch

    from runners.tasks import make_task

    corpus = write(tmp_path, "some text to pack " * 400, "corpus.txt")
    cases = [("s5", {"seq_len": 8, "degree": 3}), ("mqar", {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}),
             ("state_tracking", {}), ("lm", {"data_files": str(corpus), "seq_len": 16}),
             ("hop_induction", {}), ("hop_induction", {"k": "mixed", "n": 16}),
             ("pointer_chase", {"k": [1, 3]}), ("pointer_chase", {})]
    for name, params in cases:
        task = make_task(name, **params)
        x, y = task.batch(8, torch.Generator().manual_seed(0), "eval")
        logits = torch.randn(*y.shape, task.vocab_size)
        assert ("eval_loss", *task.metrics(logits, y)) == task_metrics(name, params), name
    assert set(task_metrics("pointer_chase", {"k": [1, 3]})) - set(TASK_METRICS["pointer_chase"]) == {"acc_k1", "acc_k3"}


def test_sampler_params_are_optunas():
    import optuna

    for cls, names in SAMPLER_PARAMS.items():
        real = [n for n in inspect.signature(getattr(optuna.samplers, cls).__init__).parameters if n != "self"]
        assert tuple(real) == names, cls
