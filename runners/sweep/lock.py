"""One driver per experiment directory: ``EXP/driver.lock``, held with ``fcntl.flock``.

A driver takes the lock before it reads or writes anything in the directory and keeps the
file open until the sweep ends. A second driver (``sweep --resume`` while the first still
runs) finds it taken and is refused with the holder's pid, host and start time, which the
holder wrote into the file.

Why ``flock`` on an open file rather than a lock file made with ``O_EXCL``: the kernel
drops the lock when its process ends, however it ends (``kill -9``, out-of-memory, a
segfault), so a killed driver never leaves a stale lock, and nothing has to guess whether
a recorded pid is still the driver (pids are reused; one on another host cannot be
checked at all). The file itself stays; what it says only names the last holder. The
descriptor is not inherited by worker processes (Python opens files non-inheritable and
the workers are spawned, not forked), so a worker outliving its driver holds nothing. On
NFS, Linux emulates ``flock`` with byte-range locks seen by every client; a filesystem
without locks at all is run unlocked, and :attr:`DriverLock.note` says so.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from nas.errors import LoopnasError

LOCK = "driver.lock"
SYSTEM = (Path("/proc"), Path("/sys"))


class LockError(LoopnasError):
    """The directory cannot be locked: another driver holds it, or it cannot be a directory."""


class DriverLock:
    """The lock of one experiment directory, held until :meth:`release` (or the process ends).
    ``made``: the directories :func:`acquire` created, deepest first (a failed start removes
    them again when they are empty)."""

    def __init__(self, path: Path, fd: int | None, made: list[Path], note: str = ""):
        self.path, self._fd, self.made, self.note = path, fd, made, note

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    __del__ = release  # a sweep dropped without close() does not keep its directory


def check_place(exp_dir: Path) -> None:
    """Refuse an output directory under /proc or /sys, or one that is a file (a LockError)."""
    resolved = exp_dir.resolve()
    for root in SYSTEM:
        if resolved.is_relative_to(root):
            raise LockError(f"--out {exp_dir} is under {root}; choose a directory of your own")
    if exp_dir.exists() and not exp_dir.is_dir():
        raise LockError(f"--out {exp_dir} exists and is not a directory; choose a directory")


def _make(exp_dir: Path) -> list[Path]:
    """Create ``exp_dir`` and its missing parents; the ones created, deepest first."""
    missing = [p for p in (exp_dir, *exp_dir.parents) if not p.exists()]
    exp_dir.mkdir(parents=True, exist_ok=True)
    return missing


def holder_text(fd: int) -> str:
    """Who wrote the lock file: ``pid 1234 on host since 2025-01-02 10:11:12``."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"pid {int(info['pid'])} on {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid is not written yet"


def _open(exp_dir: Path) -> int:
    """The lock file, opened for writing without following a symlink: a link planted there
    (to send the driver's note over a file of yours) is replaced by a file of its own, its
    target untouched (issue #34)."""
    path = exp_dir / LOCK
    for _ in range(8):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP or not path.is_symlink():
                raise LockError(f"--out {exp_dir}: cannot create the experiment directory ({exc.strerror})") from None
        try:
            path.unlink()  # the link, never its target
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise LockError(f"--out {exp_dir}: {LOCK} is a symbolic link it cannot replace ({exc.strerror})") from None
    raise LockError(f"--out {exp_dir}: {LOCK} keeps being replaced by a symbolic link; choose a directory of your own")


def acquire(exp_dir: str | Path) -> DriverLock:
    """Lock ``exp_dir`` (created if missing) for this process, or raise :class:`LockError`."""
    exp_dir = Path(exp_dir)
    check_place(exp_dir)
    try:
        made = _make(exp_dir)
    except OSError as exc:
        raise LockError(f"--out {exp_dir}: cannot create the experiment directory ({exc.strerror})") from None
    while True:
        fd = _open(exp_dir)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = holder_text(fd)
            os.close(fd)
            raise LockError(f"{exp_dir} is in use by another sweep driver ({who}); wait for it to end "
                            "or stop it, then resume") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            return DriverLock(exp_dir / LOCK, None, made,
                              note=f"unlocked: {exp_dir}'s filesystem has no file locks ({exc.strerror})")
        try:
            if os.fstat(fd).st_ino == os.lstat(exp_dir / LOCK).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the file was removed (a failed start) after we opened it: lock the new one
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode() + b"\n", 0)
    except OSError:
        pass  # a full disk: the lock holds without its note
    return DriverLock(exp_dir / LOCK, fd, made)


__all__ = ["LOCK", "DriverLock", "LockError", "acquire", "holder_text"]
