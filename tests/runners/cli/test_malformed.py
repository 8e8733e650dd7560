"""Every malformed spec in ``fixtures/malformed`` fails ``loopnas validate`` with exit code 2
and one line per problem: ``error: <file>: <field path>: <what is wrong, what is valid>``.

Each fixture starts with one ``# expect: <field path> | <message substring>`` line per
problem it contains (an empty path: a problem with the file as a whole).
"""
import subprocess
import sys
from pathlib import Path

import pytest

from runners.cli import main
from helpers import REPO, TESTS

FIXTURES = TESTS / "fixtures" / "malformed"
CASES = sorted(FIXTURES.glob("*.yaml"))
# pydantic internals that must never reach a user
LEAKS = ("function-after", "constrained-", "literal[", "tuple[", "Spec]", "Input should",
         "Value error", "instance of", "[key]", "Traceback")


def expectations(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        if not line.startswith("# expect:"):
            break
        where, what = line[len("# expect:"):].split("|", 1)
        out.append((where.strip(), what.strip()))
    return out


def check_output(path: Path, rc: int, out: str, err: str) -> None:
    expected = expectations(path)
    lines = err.splitlines()
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    assert not out.strip(), out
    assert len(lines) == len(expected), f"one line per problem expected:\n{err}"
    for leak in LEAKS:
        assert leak not in err, f"{leak!r} leaked into:\n{err}"
    for field, message in expected:
        head = f"error: {path}: {field}: " if field else f"error: {path}: "
        hits = [l for l in lines if l.startswith(head) and message in l[len(head):]]
        assert hits, f"no line starting {head!r} containing {message!r} in:\n{err}"


def test_enough_distinct_fixtures():
    assert len(CASES) >= 40
    texts = {p.read_bytes().split(b"\n", 1)[1] for p in CASES}
    assert len(texts) == len(CASES), "two fixtures hold the same spec"
    assert all(expectations(p) for p in CASES), "a fixture lacks its '# expect:' line"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_validate_reports_problem(path, capsys):
    rc = main(["validate", str(path)])
    captured = capsys.readouterr()
    check_output(path, rc, captured.out, captured.err)


@pytest.mark.parametrize("name", ["yaml_tab_indent", "unknown_mixer_kind", "loop_list_bad_entry",
                                  "defaults_bad_value", "elr_missing_counts", "not_utf8"])
def test_validate_subprocess(name):
    path = FIXTURES / f"{name}.yaml"
    proc = subprocess.run([sys.executable, "-m", "runners", "validate", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    check_output(path, proc.returncode, proc.stdout, proc.stderr)


def test_every_file_is_reported(capsys):
    """A batch keeps going after a bad file and still exits 2."""
    good = REPO / "spaces" / "archs" / "tiny_mixerloop.yaml"
    bad = [FIXTURES / "unknown_top_field.yaml", FIXTURES / "yaml_tab_indent.yaml"]
    rc = main(["validate", str(bad[0]), str(good), str(bad[1])])
    captured = capsys.readouterr()
    assert rc == 2
    assert f"ok  {good}" in captured.out
    assert [l.split(": ")[1] for l in captured.err.splitlines()] == [str(b) for b in bad]


def test_missing_file(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["validate", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {missing}: no such file; give the path of a .yaml spec"
