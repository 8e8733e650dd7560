"""``loopnas export --out DIR`` into an earlier export replaces only the files an export
writes (its ``loopnas_export.json``) and never deletes anything else; any other non-empty
directory, a file, /proc and /sys are refused with one line."""
import json
from pathlib import Path

import pytest
import torch

from builders.model import build_model
from nas import load_arch
from runners.cli import main
from runners.export import ExportError, export_spec
from runners.export.export import MANIFEST

ROOT = Path(__file__).resolve().parents[1]


def spec(name: str) -> Path:
    return ROOT / "spaces" / "archs" / f"{name}.yaml"


def mine(out: Path) -> dict[str, str]:
    """A user's things inside an export: notes, a git repository, a file in scaled/."""
    files = {"notes.txt": "my notes", ".git/HEAD": "ref: refs/heads/main\n",
             ".git/objects/ab/cdef": "blob"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return files


def assert_kept(out: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        assert (out / name).read_text() == text, name


def manifest(out: Path) -> set[str]:
    return set(json.loads((out / MANIFEST).read_text())["files"])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def weights(tmp_path) -> Path:
    """A checkpoint of tiny_noloop's (untrained) weights."""
    path = tmp_path / "w.pt"
    torch.save({"model": build_model(load_arch(spec("tiny_noloop")), backend="torch").state_dict()}, path)
    return path


def test_the_manifest_lists_every_file_written(tmp_path):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e", scale_to=2e6).out
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert manifest(out) == on_disk - {MANIFEST}
    assert {"config.json", "modeling_loopnas.py", "scaled/config.json"} <= manifest(out)


def test_a_user_file_and_a_git_directory_survive_a_re_export(tmp_path):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e").out
    files = mine(out)
    export_spec(spec("tiny_mixerloop"), out)
    assert_kept(out, files)
    assert json.loads((out / "config.json").read_text())["arch"]["name"] == "tiny_mixerloop"
    assert not any(p.name.startswith(".loopnas-export-") for p in out.iterdir())  # staging removed


def test_a_re_export_deletes_only_the_files_it_no_longer_writes(tmp_path, weights):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e", checkpoint=weights, scale_to=2e6).out
    files = mine(out)
    (out / "scaled" / "plan.md").write_text("mine too")
    export_spec(spec("tiny_noloop"), out)
    assert not (out / "model.safetensors").exists()
    assert [p.name for p in (out / "scaled").iterdir()] == ["plan.md"]  # the export's files went
    assert_kept(out, files)
    assert "model.safetensors" not in manifest(out) and (out / "config.json").is_file()
    (out / "scaled" / "plan.md").unlink()
    export_spec(spec("tiny_noloop"), out, scale_to=2e6)
    export_spec(spec("tiny_noloop"), out)
    assert not (out / "scaled").exists()  # emptied by the export, so removed with its files


def test_out_dot_inside_an_export(tmp_path, monkeypatch, capsys):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e").out
    files = mine(out)
    monkeypatch.chdir(out)
    assert main(["export", "tiny_mixerloop", "--out", "."]) == 0
    assert "exported tiny_mixerloop" in capsys.readouterr().out
    assert_kept(out, files)
    assert json.loads((out / "config.json").read_text())["arch"]["name"] == "tiny_mixerloop"


def test_a_non_empty_directory_that_is_no_export_is_refused(tmp_path, capsys):
    busy = tmp_path / "busy"
    files = mine(busy)
    assert main(["export", "tiny_noloop", "--out", str(busy)]) == 2
    assert "is not empty and holds no loopnas export" in one_error_line(capsys)
    assert_kept(busy, files)
    assert sorted(p.name for p in busy.iterdir()) == [".git", "notes.txt"]


def test_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("mine")
    assert main(["export", "tiny_noloop", "--out", str(tmp_path / "f")]) == 2
    assert "exists and is not a directory" in one_error_line(capsys)
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.parametrize("out", ["/proc/loopnas-export", "/sys/loopnas-export", "/proc"])
def test_proc_and_sys_are_refused(out, capsys):
    assert main(["export", "tiny_noloop", "--out", out]) == 2
    assert "choose a directory of your own" in one_error_line(capsys)


def test_a_failed_export_leaves_the_earlier_one_as_it_was(tmp_path):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e").out
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    wrong = tmp_path / "wrong.pt"  # weights of another size
    torch.save({"model": {"embed.weight": torch.zeros(3, 5)}}, wrong)
    with pytest.raises(ExportError, match="do not fit"):
        export_spec(spec("tiny_mixerloop"), out, checkpoint=wrong)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_export_from_before_the_manifest_is_replaced_too(tmp_path, weights):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e", checkpoint=weights).out
    (out / MANIFEST).unlink()
    files = mine(out)
    export_spec(spec("tiny_noloop"), out)
    assert not (out / "model.safetensors").exists()  # a file every weighted export writes
    assert_kept(out, files)
    assert "config.json" in manifest(out)


def test_a_manifest_never_deletes_outside_the_export(tmp_path):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e").out
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    listed = json.loads((out / MANIFEST).read_text())
    listed["files"] += ["../victim.txt", str(victim)]
    (out / MANIFEST).write_text(json.dumps(listed))
    export_spec(spec("tiny_noloop"), out)
    assert victim.read_text() == "mine"
