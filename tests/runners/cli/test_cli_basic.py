"""``loopnas validate`` and ``loopnas show``: shipped specs, shipped names, canonical YAML,
no heavy imports, usage errors as exit 2 without a traceback."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nas import load_arch, loads_arch
from runners.cli import main
from spaces import ARCHS, arch_names
from helpers import REPO

SHIPPED = sorted(ARCHS.glob("*.yaml"))
IDS = [p.stem for p in SHIPPED]
HEAVY = ("torch", "fla", "ray", "triton", "transformers")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runners", *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_validate_every_shipped_spec(capsys):
    assert main(["validate", *map(str, SHIPPED)]) == 0
    out = capsys.readouterr()
    assert not out.err
    lines = out.out.splitlines()
    assert [l.split()[1] for l in lines] == [str(p) for p in SHIPPED]
    assert all(l.startswith("ok  ") for l in lines)


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_show_every_shipped_spec(path, capsys):
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    arch = load_arch(path)
    assert f"{arch.name}: {len(arch.layers)} layers" in out
    assert "canonical spec" in out


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_show_yaml_loads_back_to_the_canonical_spec(path, capsys):
    assert main(["show", "--yaml", str(path)]) == 0
    text = capsys.readouterr().out
    assert loads_arch(text) == load_arch(path)


def test_shipped_names_without_a_path(capsys):
    assert set(arch_names()) == set(IDS)
    assert main(["show", "--yaml", "mixerloop_15m"]) == 0
    assert loads_arch(capsys.readouterr().out) == load_arch(ARCHS / "mixerloop_15m.yaml")
    assert main(["validate", "tiny_elr", "noloop_15m"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ok  tiny_elr  (tiny_elr: 4 layers, 1 loop regions)",
        "ok  noloop_15m  (noloop_15m: 6 layers, 0 loop regions)"]


def test_show_summary_counts_runs(capsys):
    assert main(["show", "tiny_mixerloop"]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in re.split(r"[│┃]", l)[1:-1]] for l in out.splitlines()
            if l[:1] in ("│", "┃")]
    assert rows == [["layer", "mixer", "ffn", "mixer runs", "ffn runs", "loops"],
                    ["0", "gdn", "swiglu", "4", "1", "0"], ["1", "gdn", "swiglu", "4", "1", "1"]]


def test_validate_describes_a_one_shot_space(capsys):
    assert main(["validate", str(REPO / "spaces" / "oneshot_placement.yaml")]) == 0
    assert "one-shot, 15 placements × 3 loop counts (beam search)" in capsys.readouterr().out


def test_validate_and_show_do_not_import_heavy_libraries():
    probe = (
        "import json, sys\n"
        "from runners.cli import main\n"
        "codes = [main(['validate', 'tiny_elr']), main(['show', 'mixerloop_15m']),\n"
        "         main(['validate', 'spaces/oneshot_placement.yaml'])]\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps({'codes': codes, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"codes": [0, 0, 0], "heavy": []}


@pytest.mark.parametrize("argv", [["frobnicate"], ["validate"], ["show"], ["show", "--bogus", "x"],
                                  ["show", "tiny_elr", "tiny_noloop"]],
                         ids=["unknown-command", "validate-no-arg", "show-no-arg", "bad-option",
                              "extra-arg"])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "Error" in out.err or "error" in out.err


def test_usage_errors_in_a_real_process():
    for argv in (["frobnicate"], ["validate"]):
        proc = run(*argv)
        assert proc.returncode == 2
        assert "Traceback" not in proc.stdout + proc.stderr
        assert "Usage:" in proc.stderr


@pytest.mark.parametrize("command", ["show", "cost", "graph", "bench", "validate"])
def test_unknown_shipped_name_suggests_the_nearest(command, capsys):
    assert main([command, "mixerloop_16m"]) == 2
    assert capsys.readouterr().err.strip() == ("error: mixerloop_16m: neither a file nor a shipped "
                                               "architecture; did you mean 'mixerloop_15m'? or give "
                                               "the path of a .yaml spec")


def test_unknown_name_far_from_any_lists_the_shipped_ones(capsys):
    assert main(["show", "qqqq"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: qqqq: neither a file nor a shipped architecture; shipped names: ")
    assert "mixerloop_15m" in err and "tiny_noloop" in err


def test_real_process_round_trip():
    proc = run("show", "--yaml", "tiny_selective")
    assert proc.returncode == 0, proc.stderr
    assert loads_arch(proc.stdout) == load_arch(ARCHS / "tiny_selective.yaml")


def test_the_process_end_is_quiet_after_triton():
    """The entry point freezes the collector's objects at exit (a report of 10,000 candidates
    ends 1 s sooner), but not once triton is loaded: its nanobind bindings would print every
    object left alive as a leak on stderr."""
    code = ("import sys, triton; sys.argv = ['loopnas', 'validate', sys.argv[1]]; "
            "from runners.cli import _entry; _entry()")
    proc = subprocess.run([sys.executable, "-c", code, str(SHIPPED[0])], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "leaked" not in proc.stderr
