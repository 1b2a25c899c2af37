"""Atomic file output: write to a temporary file beside the target, rename when complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_output", "ensure_parent", "make_directory"]


def ensure_parent(path: str | os.PathLike[str], what: str = "file") -> Path:
    """The path as a ``Path``, after checking its directory exists (clear error otherwise)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"cannot write {what} {str(target)!r}: directory {str(target.parent)!r} does not exist"
        )
    return target


def make_directory(path: str | os.PathLike[str], who: str, what: str = "directory") -> Path:
    """Create ``path`` (and its parents) unless it exists; an error that names ``who`` else."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(
            f"{who}: cannot create the {what} {str(directory)!r}: {exc.strerror}"
        ) from exc
    if not directory.is_dir():
        raise NotADirectoryError(f"{who}: {str(directory)!r} exists and is not a directory")
    return directory


def _process_umask() -> int:
    """The umask, read without changing it (Linux), else the common 0o022."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str], *, what: str = "file", fsync: bool = False
) -> Iterator[IO[bytes]]:
    """Yield a binary file; on success it replaces ``path``, on error it is removed."""
    target = ensure_parent(path, what)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o666 & ~_process_umask()
        os.chmod(fd, mode)
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            yield fh
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
