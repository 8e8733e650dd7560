"""``loopnas export --out DIR`` into an earlier export replaces only the files an export
provably wrote (named in its ``loopnas_export.json`` with their hashes) and never deletes
anything else, whatever a manifest claims; any other non-empty directory, a file, a path
under a file, a dangling symlink or a symlink loop, /proc and /sys are refused with one
line."""
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from builders.model import build_model
from nas import load_arch
from runners.cli import main
from runners.export import ExportError, export_spec
from runners.export.export import MANIFEST
from runners.export.outdir import exportable
from helpers import REPO

ROOT = REPO


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
    assert all(exportable(name) for name in manifest(out))
    hashes = json.loads((out / MANIFEST).read_text())["files"]
    assert all(hashes[n] == sha256(out / n) for n in hashes)
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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict:
    return {p: (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("old", ["no-manifest", "format-1"])
def test_an_export_without_hashes_is_never_overwritten(tmp_path, weights, capsys, old):
    """An export from before the hashes proves no file its own: a re-export that would change
    one of them is refused; the same export again (the same bytes) goes through and records
    the hashes."""
    out = export_spec(spec("tiny_noloop"), tmp_path / "e", checkpoint=weights).out
    if old == "no-manifest":
        (out / MANIFEST).unlink()
    else:
        (out / MANIFEST).write_text(json.dumps({"format": 1, "files": sorted(manifest(out))}))
    files = mine(out)
    before = snapshot(tmp_path)
    assert main(["export", str(spec("tiny_noloop")), "--out", str(out)]) == 2  # README would change
    assert "README.md is not a file an earlier export wrote" in one_error_line(capsys)
    assert snapshot(tmp_path) == before
    assert main(["export", str(spec("tiny_noloop")), "--out", str(out), "--checkpoint", str(weights)]) == 0
    assert_kept(out, files)
    assert json.loads((out / MANIFEST).read_text())["files"]["model.safetensors"] == sha256(out / "model.safetensors")


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_planted_manifest_deletes_nothing_of_yours(tmp_path, capsys, fmt):
    """issue #34: a loopnas_export.json listing thesis.tex and .git/HEAD (with their true
    hashes, in format 2) made export delete both."""
    out = tmp_path / "DIR"
    files = {"thesis.tex": "\\section{Results}", ".git/HEAD": "ref: refs/heads/main\n"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    outside = tmp_path / "victim.txt"
    outside.write_text("mine")
    listed = [*files, "../victim.txt", str(outside), "scaled/../../victim.txt"]
    hashes = {n: sha256(out / n) for n in files} | {n: sha256(outside) for n in listed[2:]}
    (out / MANIFEST).write_text(json.dumps({"format": 1, "files": listed} if fmt == 1 else
                                           {"format": 2, "files": hashes}))
    assert main(["export", "tiny_noloop", "--out", str(out)]) == 0
    assert_kept(out, files)
    assert outside.read_text() == "mine"
    assert set(manifest(out)) >= {"config.json", "README.md"} and "thesis.tex" not in manifest(out)
    assert main(["export", "tiny_mixerloop", "--out", str(out)]) == 0  # and again, from its own manifest
    assert_kept(out, files)


def test_an_edited_file_of_an_export_is_not_overwritten(tmp_path, capsys):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e").out
    (out / "README.md").write_text("my notes on this model")
    before = snapshot(tmp_path)
    assert main(["export", "tiny_mixerloop", "--out", str(out)]) == 2
    assert "README.md is not a file an earlier export wrote" in one_error_line(capsys)
    assert snapshot(tmp_path) == before


def test_symlinks_in_an_export_are_never_followed(tmp_path, weights, capsys):
    """A manifest naming a symlink (with its target's hash), or a scaled/ that links out of
    the export: neither the link nor what it points at is deleted or written through."""
    out = export_spec(spec("tiny_noloop"), tmp_path / "e", checkpoint=weights).out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "weights.bin").write_bytes((out / "model.safetensors").read_bytes())
    (elsewhere / "config.json").write_text("{}")
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").symlink_to(elsewhere / "weights.bin")
    (out / "scaled").symlink_to(elsewhere, target_is_directory=True)
    data = json.loads((out / MANIFEST).read_text())
    data["files"]["scaled/config.json"] = sha256(elsewhere / "config.json")
    data["files"]["model.safetensors"] = sha256(elsewhere / "weights.bin")
    (out / MANIFEST).write_text(json.dumps(data))
    export_spec(spec("tiny_noloop"), out)  # no weights, no scaled/: both would be deleted if proven
    assert (out / "model.safetensors").is_symlink() and (out / "scaled").is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["config.json", "weights.bin"]
    before = snapshot(tmp_path)
    assert main(["export", "tiny_noloop", "--out", str(out), "--scale-to", "2e6"]) == 2
    assert "scaled is a symbolic link or a file" in one_error_line(capsys)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["dangling-symlink", "symlink-loop", "under-a-file", "under-a-dangling-link"])
def test_an_out_that_cannot_be_a_directory_is_one_line(tmp_path, capsys, case):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    out, message = {"dangling-symlink": ("dangling", "which does not exist"),
                    "symlink-loop": ("loop_a", "symbolic link loop"),
                    "under-a-file": ("file/sub/dir", "is under"),
                    "under-a-dangling-link": ("dangling/sub", "which does not exist")}[case]
    before = snapshot(tmp_path)
    assert main(["export", "tiny_noloop", "--out", str(tmp_path / out)]) == 2
    assert message in one_error_line(capsys)
    assert snapshot(tmp_path) == before and not (tmp_path / "nowhere").exists()


def test_a_manifest_never_deletes_outside_the_export(tmp_path):
    out = export_spec(spec("tiny_noloop"), tmp_path / "e").out
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    listed = json.loads((out / MANIFEST).read_text())
    listed["files"].update({"../victim.txt": sha256(victim), str(victim): sha256(victim)})
    (out / MANIFEST).write_text(json.dumps(listed))
    export_spec(spec("tiny_noloop"), out)
    assert victim.read_text() == "mine"
