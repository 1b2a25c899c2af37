"""Append-only line files that always end on a whole record.

Every append-only file stepscope writes (metrics JSONL/CSV, spill files, metric tables) goes
through here: a record is appended with ``append_whole``, which cuts the file back to where it
was when a write fails part-way (a full disk), so the next record never lands on a torn line.
A process killed mid-write can still leave a torn last line; ``repair_tail`` removes it when
the file is opened again, and ``read_lines`` skips it and says so.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Lines", "append_whole", "open_append", "read_lines", "repair_tail"]

_TAIL_CHUNK = 1 << 16


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` to ``fd``; if that fails part-way, cut the file back and re-raise."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def repair_tail(fd: int) -> int:
    """Cut bytes after the last newline (a record torn by a kill); returns how many were cut."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        chunk = os.pread(fd, end - start, start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            keep = start + at + 1
            break
        end = start
    else:
        keep = 0
    if keep < size:
        os.ftruncate(fd, keep)
    return size - keep


def open_append(path: Path, *, private: bool = False) -> int:
    """An ``O_APPEND`` descriptor on ``path`` with any torn last line removed.

    ``private`` files are created 0600 (``O_EXCL`` when new) and links are refused
    (``O_NOFOLLOW``); an existing one must be a regular file owned by this user.
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC  # read: repair_tail
    if not private:
        fd = os.open(path, flags, 0o644)
    else:
        flags |= os.O_NOFOLLOW
        try:
            fd = os.open(path, flags | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, flags, 0o600)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                os.close(fd)
                raise PermissionError(
                    f"{path} is not a regular file owned by this user; refusing to append to it"
                ) from None
    try:
        repair_tail(fd)
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class Lines:
    """The whole lines of a file and how many torn bytes at its end were skipped."""

    lines: list[bytes] = field(default_factory=list)
    torn_bytes: int = 0


def read_lines(path: str | os.PathLike[str]) -> Lines:
    """The file's non-empty whole lines (without newlines); a torn last line is skipped."""
    data = Path(path).read_bytes()
    cut = data.rfind(b"\n") + 1
    return Lines([ln for ln in data[:cut].split(b"\n") if ln.strip()], len(data) - cut)
