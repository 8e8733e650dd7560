"""A space's ``scales:`` and ``match: {vary: scale}``: resolved without pricing, the base
grown to each scale, priced like the model built from it, and printed or refused by
``loopnas validate`` (no torch)."""
import subprocess
import sys
import textwrap

import optuna
import pytest

from nas.budget import scale_arch, widen
from nas.cost import projection_flops, unique_params
from nas.errors import SpecError
from nas.load import load_arch
from nas.space import MAX_SCALES, Scale, cost_value, load_space, resolve_scales, scale_base
from nas.units import si
from runners.cli import main
from spaces import arch_path

SPACE = """\
name: grows
base: tiny_elr
params:
  T: {target: loop.T, choices: [2, 4]}
objectives:
  - {metric: acc, direction: maximize}
  - {metric: projection_flops, direction: minimize}
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}
"""


def write(tmp_path, scales: str | None = None, match: str | None = None, name="space.yaml"):
    text = SPACE
    if scales is not None:
        text = text.replace("objectives:", f"scales: {scales}\nobjectives:")
    if match is not None:
        text = text.replace("objectives:", f"match: {match}\nobjectives:")
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_resolve_scales_lists_labels_without_pricing(tmp_path):
    space = load_space(write(tmp_path, "[1, 2, 0.5, {unique_params: 2e5}, {unique_params: 1.3e9}]"))
    assert resolve_scales(space) == [
        Scale("1x", factor=1.0), Scale("2x", factor=2.0), Scale("0.5x", factor=0.5),
        Scale("2e5", unique_params=2e5), Scale("1.3e9", unique_params=1.3e9)]
    assert resolve_scales(space.spec) == resolve_scales(space)
    assert resolve_scales(load_space(write(tmp_path, None))) == []


def test_scale_base_grows_the_base(tmp_path):
    """1x is the base; 2x doubles the width and every head; the target lands within 2%."""
    space = load_space(write(tmp_path, "[1, 2, {unique_params: 2e6}]"))
    (one, base), (two, double), (target, landed) = scale_base(space)
    assert base == load_arch(arch_path("tiny_elr")) and one.label == "1x"
    assert double.model.width == 2 * base.model.width and double.loops == base.loops
    assert [l.mixer.num_heads for l in double.layers] == [2 * l.mixer.num_heads for l in base.layers]
    assert abs(unique_params(landed) / 2e6 - 1) <= 0.02 and target.label == "2e6"


def test_scales_apply_the_space_match_first(tmp_path):
    """Every candidate is matched, so the scales grow the matched base."""
    space = load_space(write(tmp_path, "[1, 2]", "{unique_params: 400000, vary: ffn_hidden}"))
    (_, base), (_, double) = scale_base(space)
    assert abs(unique_params(base) / 4e5 - 1) <= 0.01
    assert double.layers[0].ffn.hidden_size == 2 * base.layers[0].ffn.hidden_size


def test_match_vary_scale_reaches_the_target_for_every_candidate(tmp_path):
    space = load_space(write(tmp_path, match="{unique_params: 1000000, vary: scale, tolerance: 0.005}"))
    base = load_arch(arch_path("tiny_elr"))
    for T in (2, 4):
        arch, _, _ = space.candidate(optuna.trial.FixedTrial({"T": T}))
        assert abs(cost_value(arch, "unique_params", 1024) / 1e6 - 1) <= 0.005
        assert arch.model.width > base.model.width and {r.T for r in arch.loops} == {T}
        assert [l.mixer.head_dim for l in arch.layers] == [l.mixer.head_dim for l in base.layers]


def test_scaled_params_equal_the_meta_model(tmp_path):
    """The cost model's unique parameters at each scale are the built model's (meta device)."""
    from builders.model import build_model

    space = load_space(write(tmp_path, "[2, 3, {unique_params: 1.5e6}]"))
    for scale, arch in scale_base(space):
        model = build_model(arch, backend="torch", device="meta")
        assert unique_params(arch) == sum(p.numel() for p in model.parameters()), scale.label


def test_validate_prints_each_scale_without_torch(tmp_path):
    path = write(tmp_path, "[1, 2, {unique_params: 2e6}]")
    code = ("import sys; from runners.cli import main; rc = main(['validate', %r]); "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'fla', 'ray')]; "
            "assert not heavy, heavy[:3]; sys.exit(rc)" % str(path))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"ok  {path}  (space grows: 1 parameter (2 grid points)")
    expected = [f"    scale {s.label:>3}: width {a.model.width:,}, {unique_params(a):,} unique params, "
                f"{si(projection_flops(a).total)} projection FLOPs/token" for s, a in scale_base(load_space(path))]
    assert lines[1:] == expected
    assert lines[1] == "    scale  1x: width 64, 205,036 unique params, 944.8k projection FLOPs/token"  # tiny_elr


BAD = [
    ("[0]", "scales[0]: 0 is not a width multiple; give a finite number > 0 (2 doubles the width)"),
    ("[-2]", "scales[0]: -2 is not a width multiple; give a finite number > 0 (2 doubles the width)"),
    ("[1, .inf]", "scales[1]: inf is not a width multiple; give a finite number > 0 (2 doubles the width)"),
    ("[.nan]", "scales[0]: nan is not a width multiple; give a finite number > 0 (2 doubles the width)"),
    ("[65]", "scales[0]: 65× the width is past 64×; give at most 64, or a target {unique_params: N}"),
    ("[two]", "scales[0]: 'two' is not a scale; write a width multiple (2 doubles the width) or a target "
              "{unique_params: 2e5}"),
    ("[{unique_params: -1}]", "scales[0].unique_params: -1 is not a parameter count; give a finite number > 0, "
                              "e.g. 2e5"),
    ("[{unique_params: .nan}]", "scales[0].unique_params: nan is not a parameter count; give a finite number > 0, "
                                "e.g. 2e5"),
    ("[2, 2.0]", "scales[1]: 2x repeats scales[0]; remove it"),
    (str(list(range(1, MAX_SCALES + 2))), f"scales: {MAX_SCALES + 1} scales, at most {MAX_SCALES}: each is a "
                                          "model trained far larger; keep the ones you mean to train"),
    ("[{unique_params: 1e12}]", "scales[0].unique_params: 1e12 needs more than 64× the width (64× gives "
                                "{top:.3g}); give at most {top:.3g}"),
    ("[{unique_params: 1000}]", "scales[0].unique_params: 1000 unique parameters is out of reach of tiny_elr "
                                "grown in proportion: the nearest width (8) gives {w8}, and no FFN width "
                                "closes the gap; give a larger target"),
]


@pytest.mark.parametrize("scales, message", BAD, ids=[b[0][:24] for b in BAD])
def test_bad_scales_fail_validate_in_one_line(tmp_path, capsys, scales, message):
    path = write(tmp_path, scales)
    base = load_arch(arch_path("tiny_elr"))
    if "{top" in message or "{w8}" in message:  # figures of the base, from the cost model
        message = message.format(top=unique_params(scale_arch(base, 64)), w8=unique_params(widen(base, 8)))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {path}: {message}"]


def test_a_width_multiple_with_no_valid_spec_fails_validate(tmp_path, capsys):
    """One Mamba-2 head of 256 at width 256: no width within 64 of 1.5 × 256 is a multiple of 256."""
    base = tmp_path / "m.yaml"
    base.write_text("name: m\nmodel: {vocab_size: 256, width: 256}\n"
                    "layer: {mixer: {kind: mamba2, head_dim: 256, expand: 1, state_size: 16}}\nnum_layers: 1\n")
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.replace("tiny_elr", "m.yaml").replace("T: {target: loop.T, choices: [2, 4]}",
                                                                 "T: {target: loop.T, choices: [1]}")
                    .replace("objectives:", "scales: [2, 1.5]\nobjectives:"))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {path}: scales[1]: no width near 384 (m's 256 × 1.5) gives a valid spec; pick another factor"]
    with pytest.raises(SpecError):
        scale_base(load_space(path))
