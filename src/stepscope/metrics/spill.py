"""The spill file: where batches go when a backend stays down, as JSON lines.

Each write appends whole lines or nothing (``stepscope.appendlog``), so the file is valid JSON
lines even after a full disk or a kill (a torn last line is cut at the next open and skipped by
``read_spill``).  A size budget bounds it; what does not fit is counted as dropped by the caller.
Files are private: created 0600 (``O_EXCL``, links refused), by default in a per-user 0700
directory that is checked before use.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any

from stepscope.appendlog import append_whole, open_append, read_lines
from stepscope.jsonenc import json_bytes
from stepscope.text import clean_text

__all__ = ["SpillEntries", "SpillFile", "default_spill_dir", "private_dir", "read_spill"]


def _safe(name: str) -> str:
    """A file-name part for ``name``: safe characters, at most 100 of them, never empty."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "exporter"
    if len(safe) > 100:  # file names have a length limit; keep long names apart by a hash
        safe = f"{safe[:80]}-{zlib.crc32(clean_text(name).encode()):08x}"
    return safe


def default_spill_dir() -> Path:
    """``$TMPDIR/stepscope-spill-<uid>``: private to this user."""
    return Path(tempfile.gettempdir()) / f"stepscope-spill-{os.getuid()}"


def private_dir(directory: Path) -> None:
    """Create ``directory`` 0700, or check that the existing one is ours, private and no link."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700, parents=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"spill directory {directory} is not a private (0700) directory owned by this "
            "user; remove it or set spill_dir"
        )


class SpillFile:
    """An append-only JSON-lines file with a byte budget, one per exporter and process."""

    def __init__(self, directory: Path, name: str, max_bytes: int) -> None:
        self.directory = directory
        self.name = name
        self.max_bytes = max_bytes
        self.written = 0
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        """The file for this process (named after the exporter and the pid)."""
        if self._path is None:
            self._path = self.directory / f"{_safe(self.name)}-{os.getpid()}.jsonl"
        return self._path

    def write(self, entries: list[dict[str, Any]]) -> str | None:
        """Append ``entries``; None on success, else the reason they were not written."""
        try:
            raw = b"".join(json_bytes(e) + b"\n" for e in entries)
        except (TypeError, ValueError):
            return "unserialisable"
        if self.written + len(raw) > self.max_bytes:
            return "spill_full"
        try:
            if self.directory == default_spill_dir():
                private_dir(self.directory)  # shared /tmp: it must be ours and 0700
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
            fd = open_append(self.path, private=True)
            try:
                append_whole(fd, raw)
            finally:
                os.close(fd)
        except OSError:
            return "spill_error"
        self.written += len(raw)
        return None

    def after_fork_in_child(self) -> None:
        """A forked child writes its own file."""
        self._path = None
        self.written = 0


class SpillEntries(list[dict[str, Any]]):
    """The entries of a spill file, with how many torn bytes at its end were skipped."""

    torn_bytes = 0


def read_spill(path: str | os.PathLike[str]) -> SpillEntries:
    """The entries of a spill file, oldest first (a torn last line is skipped and counted)."""
    found = read_lines(path)
    out = SpillEntries(json.loads(line) for line in found.lines)
    out.torn_bytes = found.torn_bytes
    return out
