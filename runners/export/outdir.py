"""The export directory: where an export may write, and what it may replace or delete there.

An export is written into a staging folder inside ``--out``, then moved into place.
``loopnas_export.json`` (the manifest) records every file it wrote with its SHA-256. A
manifest is only a claim (anyone can write one), so a later export replaces or deletes a
file only when it can prove an export wrote it: a name exports write (:func:`exportable`),
reached through real folders inside ``--out``, a regular file (not a symlink), whose bytes
hash to what the manifest recorded. A file at a name the export writes that it cannot prove
its own (an edited README, someone's config.json, an export from before the hashes) is
refused with one line, unless its bytes are the very ones about to be written; anything else
in ``--out`` (a ``.git``, notes) is never touched, whatever the manifest lists.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Iterator

from runners.checkpoint import write_text
from runners.results.records import read_bounded

from . import vendor
from .pick import ExportError

MANIFEST = "loopnas_export.json"
FORMAT = 2  # 1: a list of names, no hashes (proves nothing)
MAX_MANIFEST = 1 << 20  # bytes: a manifest lists a few dozen files
_NAMES = frozenset({"config.json", "configuration_loopnas.py", "modeling_loopnas.py", vendor.MANIFEST,
                    "model.safetensors", "spec.yaml", "cost.json", "README.md"})
_VENDORED = re.compile(r"(nas|builders)(_[A-Za-z0-9_]+)?\.py")  # vendor.flat_name of a module
_STAGE = ".loopnas-export-"
_SYSTEM = (Path("/proc"), Path("/sys"))


def exportable(name: object) -> bool:
    """``name`` is a file some export writes: a top-level one, or the same in ``scaled/``."""
    if not isinstance(name, str) or "\\" in name:
        return False
    parts = PurePosixPath(name).parts
    parts = parts[1:] if len(parts) == 2 and parts[0] == "scaled" else parts
    return len(parts) == 1 and (parts[0] in _NAMES or _VENDORED.fullmatch(parts[0]) is not None)


def digest(path: Path) -> str | None:
    """SHA-256 of a regular file, opened without following a symlink; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO must not block
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _bad_folder(root: Path, name: str) -> Path | None:
    """The first folder on ``name``'s way that is a symlink or not a folder (None: all real)."""
    folder = root
    for part in PurePosixPath(name).parts[:-1]:
        folder = folder / part
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            return folder
    return None


def proven(root: Path, name: str, hashes: tuple[str, ...]) -> bool:
    """``root/name`` is provably a file an export wrote (module docstring)."""
    return (exportable(name) and bool(hashes) and _bad_folder(root, name) is None
            and digest(root / name) in hashes)


def target(out: Path) -> Path:
    """``--out`` resolved, if an export may write there (a directory, or nothing yet); one
    line for a symlink loop, a dangling symlink, a path under a file, /proc or /sys."""
    try:
        resolved = out.resolve()
    except (OSError, RuntimeError):
        raise ExportError(f"--out {out} is a symbolic link loop; choose a directory") from None
    for link in (out, *out.parents):
        if link.is_symlink() and not link.exists():
            raise ExportError(f"--out {out}: {link} is a symbolic link to {os.readlink(link)}, "
                              "which does not exist; choose a directory")
    for root in _SYSTEM:
        if resolved.is_relative_to(root):
            raise ExportError(f"--out {out} is under {root}; choose a directory of your own")
    for path in (*reversed(resolved.parents), resolved):
        if not path.exists():
            break
        if not path.is_dir():
            raise ExportError(f"--out {out} exists and is not a directory" if path == resolved else
                              f"--out {out} is under {path}, which is a file, not a directory")
    return resolved


def recorded(root: Path) -> dict[str, tuple[str, ...]] | None:
    """What ``root``'s manifest claims: exportable names and their hashes (a format-1 list:
    names without hashes); None when there is no readable manifest."""
    path = root / MANIFEST
    try:
        if path.is_symlink():
            return None
        files = json.loads(read_bounded(path, MAX_MANIFEST))["files"]  # Skipped is a ValueError
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(files, list):
        files = {f: [] for f in files if isinstance(f, str)}
    if not isinstance(files, dict):
        return None
    hashes = {n: [h] if isinstance(h, str) else h if isinstance(h, list) else [] for n, h in files.items()}
    return {n: tuple(x for x in h if isinstance(x, str)) for n, h in hashes.items() if exportable(n)}


def _is_export(folder: Path) -> bool:
    """``folder/config.json`` is an export's (read bounded: a FIFO or a device there is no
    export, not a hang)."""
    try:
        return json.loads(read_bounded(folder / "config.json", MAX_MANIFEST)).get("model_type") == "loopnas"
    except (OSError, ValueError, AttributeError):
        return False


def earlier(root: Path) -> dict[str, tuple[str, ...]]:
    """The files an earlier export in ``root`` claims, with their hashes. A new or empty
    directory has none; one holding anything but an export is refused."""
    if not root.is_dir() or all(p.name.startswith(_STAGE) for p in root.iterdir()):
        return {}
    files = recorded(root)
    if files is not None:
        return files
    if _is_export(root):
        return {}  # an export from before the manifest: it proves no file its own
    raise ExportError(f"--out {root} is not empty and holds no loopnas export; choose a new directory")


def _blocked(out: Path, root: Path, written: dict[str, str], before: dict[str, tuple[str, ...]]) -> None:
    """Refuse (before anything is moved) to replace a file this export cannot prove its own."""
    for name in sorted({MANIFEST, *written}):
        bad = _bad_folder(root, name)
        if bad is not None:
            raise ExportError(f"--out {out}: {bad.relative_to(root)} is a symbolic link or a file, not a "
                              "folder of the export; move it away or choose another directory")
        path = root / name
        if not (path.exists() or path.is_symlink()):
            continue
        if name == MANIFEST:
            if path.is_symlink() or not path.is_file():
                raise ExportError(f"--out {out}: {MANIFEST} is not a regular file; move it away")
        elif digest(path) != written[name] and not proven(root, name, before.get(name, ())):
            raise ExportError(f"--out {out}: {name} is not a file an earlier export wrote (edited since, "
                              "someone else's, or from an export that recorded no hashes), so it is not "
                              "replaced; move it away or choose another directory")


def _write_manifest(root: Path, files: dict[str, list[str] | str], info: dict) -> None:
    data = {"format": FORMAT, "files": dict(sorted(files.items())), **info}
    write_text(root / MANIFEST, json.dumps(data, indent=1) + "\n")


def _remove(root: Path, name: str, hashes: tuple[str, ...]) -> None:
    """Delete one file an earlier export provably wrote, and its folders if that left them empty."""
    if not proven(root, name, hashes):
        return
    (root / name).unlink()
    for folder in PurePosixPath(name).parents[:-1]:
        with contextlib.suppress(OSError):  # not empty: it holds someone else's files
            (root / folder).rmdir()


@contextlib.contextmanager
def staged(out: Path, info: dict | None = None) -> Iterator[Path]:
    """A staging folder to write an export into. On success its files replace ``out``'s
    (only those provably an earlier export's, or byte-identical), the earlier export's files
    this one no longer writes are deleted (only those proven), and the manifest records the
    new files' hashes and ``info``. A refused or failed export leaves ``out`` as it was."""
    root = target(out)
    before = earlier(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=_STAGE, dir=root))
    except OSError as exc:
        raise ExportError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    try:
        yield stage
        written = {p.relative_to(stage).as_posix(): digest(p) for p in sorted(stage.rglob("*")) if p.is_file()}
        _blocked(out, root, written, before)
        gone = {n: h for n, h in before.items() if n not in written and proven(root, n, h)}
        # an interrupted move leaves each file either old or new: list both hashes meanwhile
        _write_manifest(root, {**{n: list(h) for n, h in gone.items()},
                               **{n: sorted({h, *before.get(n, ())}) for n, h in written.items()}}, info or {})
        for name in written:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, root / name)
        for name, hashes in sorted(gone.items()):
            _remove(root, name, hashes)
        _write_manifest(root, written, info or {})
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # this export's own staging folder


__all__ = ["MANIFEST", "FORMAT", "exportable", "digest", "proven", "target", "recorded", "earlier", "staged"]
