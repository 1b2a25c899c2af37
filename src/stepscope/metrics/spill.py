"""The spill file: where batches go when a backend stays down, as JSON lines.

Each write appends whole lines with one ``write`` call and flushes, so the file is valid JSON
lines even if the process dies.  A size budget bounds it; what does not fit is counted as
dropped by the caller.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from stepscope.trace.chrome import json_bytes

__all__ = ["SpillFile", "read_spill"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "exporter"


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
            data = "".join(json_bytes(e).decode("utf-8") + "\n" for e in entries)
        except (TypeError, ValueError):
            return "unserialisable"
        raw = data.encode()
        if self.written + len(raw) > self.max_bytes:
            return "spill_full"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as fh:
                fh.write(raw)
        except OSError:
            return "spill_error"
        self.written += len(raw)
        return None

    def after_fork_in_child(self) -> None:
        """A forked child writes its own file."""
        self._path = None
        self.written = 0


def read_spill(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a spill file, oldest first."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
