"""File exporters: JSON lines and CSV, both rotating by size.

Each batch is appended whole or not at all (``stepscope.appendlog``: a write that fails part-way,
on a full disk, is cut back, and a line torn by a kill is removed when the file is opened again),
so a file is always whole lines and a batch counts as exported only once its lines are; when a
file would pass ``max_bytes`` it is renamed to ``<path>.1`` (older ones shift to ``.2`` ...,
keeping ``backups``) and a new one is started.  A forked child writes ``<stem>.<pid><suffix>``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from stepscope.appendlog import append_whole, open_append
from stepscope.jsonenc import json_bytes
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.exporters.rows import ChangeFilter, rows
from stepscope.metrics.points import ExportBatch
from stepscope.text import clean_text

__all__ = ["CsvExporter", "JsonlExporter", "RotatingFile"]


class RotatingFile:
    """An append-only text file that rotates by size."""

    def __init__(
        self, path: str | os.PathLike[str], max_bytes: int, backups: int, header: str = ""
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            raise ValueError(f"backups must be an int >= 0, got {backups!r}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.header = header
        self._fd = -1
        self._size = 0

    def _open(self) -> int:
        if self._fd < 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_append(self.path)
            try:
                self._size = os.fstat(fd).st_size
                if self._size == 0 and self.header:
                    self._write_raw(fd, self.header.encode())
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def _write_raw(self, fd: int, raw: bytes) -> None:
        append_whole(fd, raw)
        self._size += len(raw)

    def write(self, text: str) -> None:
        """Append ``text`` (whole lines) or nothing, rotating first if it would not fit."""
        raw = clean_text(text).encode()
        fd = self._open()
        if self._size + len(raw) > self.max_bytes and self._size > len(self.header):
            self.rotate()
            fd = self._open()
        self._write_raw(fd, raw)

    def rotate(self) -> None:
        """Start a new file, keeping ``backups`` old ones."""
        self.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.path.exists():
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def close(self) -> None:
        """Close the current file."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def after_fork_in_child(self) -> None:
        """Leave the parent's file alone and write ``<stem>.<pid><suffix>`` instead."""
        if self._fd >= 0:
            os.close(self._fd)  # our copy of the parent's descriptor
        self._fd = -1
        self._size = 0
        self.path = self.path.with_name(f"{self.path.stem}.{os.getpid()}{self.path.suffix}")


class _FileExporter(Exporter):
    """An exporter appending the rows of each batch to a rotating file."""

    header = ""

    def __init__(
        self, path: str | os.PathLike[str], *, max_bytes: int = 64 << 20, backups: int = 3
    ) -> None:
        self.file = RotatingFile(path, max_bytes, backups, header=self.header)
        self._changes = ChangeFilter()

    @property
    def path(self) -> Path:
        """The file written now."""
        return self.file.path

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Append the batch's rows."""
        lines = rows(batch, self._changes)
        if lines:
            self.file.write(self.format(lines))

    def format(self, lines: list[dict[str, Any]]) -> str:
        """The text for ``lines``."""
        raise NotImplementedError

    def after_fork_in_child(self) -> None:
        """Write a per-process file in a forked child."""
        self.file.after_fork_in_child()
        self._changes.reset()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


class JsonlExporter(_FileExporter):
    """One JSON object per line: scalar points, seed-API records and changed series."""

    name = "jsonl"

    def format(self, lines: list[dict[str, Any]]) -> str:
        """One JSON object per line."""
        # json_bytes: NaN/inf (a diverged loss) become strings, so every line stays valid JSON
        return "".join(json_bytes(r).decode("utf-8") + "\n" for r in lines)


CSV_COLUMNS = (
    "time_unix_ns",
    "kind",
    "name",
    "labels",
    "step",
    "value",
    "count",
    "sum",
    "min",
    "max",
)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _labels_cell(row: dict[str, Any]) -> str:
    """The labels as a JSON object (empty when none); unpaired surrogates kept as escapes."""
    labels = dict(row.get("labels") or {})
    if row["kind"] == "record":
        labels = {"group": row.get("group") or ""}
    if not labels:
        return ""
    text = json.dumps(labels, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class CsvExporter(_FileExporter):
    """CSV with a fixed header (``CSV_COLUMNS``); histograms fill count/sum/min/max."""

    name = "csv"
    header = ",".join(CSV_COLUMNS) + "\r\n"

    def format(self, lines: list[dict[str, Any]]) -> str:
        """CSV rows in ``CSV_COLUMNS`` order."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        for row in lines:
            cells = dict(row)
            cells["labels"] = _labels_cell(row)
            writer.writerow(["" if cells.get(c) is None else cells[c] for c in CSV_COLUMNS])
        return buf.getvalue()
