"""Trace files from a path: which files a path holds, reading one, reading them all.

Every reader of traces loads them here (``stepscope report``, ``diff``, ``merge``, the
notebook's ``load_report``), so a path means the same everywhere: a file, or every
``*.json``/``*.json.gz``/``*.sstrace`` under a directory, memory timeline files beside them
left out; a file is read as the compact form when it starts with its signature, else as Chrome
JSON.  What
goes wrong is a one-line ``ValueError``.  A progress display is the caller's to pass in
(:class:`ReadProgress`; the commands pass a rich bar on a terminal): the model knows no
renderer.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

from stepscope.text import printable
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.compact_format import COMPACT_SUFFIX
from stepscope.trace.compact_reader import is_compact_trace, read_compact_trace
from stepscope.trace.model import Trace

__all__ = [
    "TRACE_SUFFIXES",
    "ReadProgress",
    "is_memory_timeline",
    "load_traces",
    "read_trace_file",
    "trace_files",
    "trace_inputs",
]

PERFETTO_SUFFIX = ".pftrace"
TRACE_SUFFIXES = (".json", ".json.gz", COMPACT_SUFFIX)

_TIMELINE_START = re.compile(rb"^\s*\[\s*\[")
"""A memory timeline file (``export_memory_timeline``): a JSON array of arrays, never a trace."""


class ReadProgress(Protocol):
    """What :func:`load_traces` tells while it reads: the count, each file, each file done."""

    def start(self, total: int) -> None:
        """Reading begins: ``total`` files."""

    def reading(self, label: str) -> None:
        """The next file (its label made printable)."""

    def advance(self) -> None:
        """One more file read (or failed)."""

    def stop(self) -> None:
        """Reading ended, however it ended."""


def trace_files(path: Path) -> list[Path]:
    """The trace files at ``path`` (a file, or every .json/.json.gz/.sstrace under a directory);
    a link that leads nowhere (a loop, a missing target) is kept so that reading it reports why."""
    if not path.exists():
        if path.is_symlink():
            raise ValueError(f"{path}: a symbolic link that leads nowhere (a loop or no target)")
        raise ValueError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ValueError(f"{path}: not a file or directory")
    found = sorted(
        p
        for p in path.rglob("*")
        if p.name.endswith(TRACE_SUFFIXES) and (p.is_file() or (p.is_symlink() and not p.exists()))
    )
    if not found:
        raise ValueError(f"{path}: no trace files (*.json, *.json.gz, *.sstrace) in this directory")
    return found


def is_memory_timeline(path: Path) -> bool:
    """Whether ``path`` holds a memory timeline (``[times, sizes]`` or raw rows)."""
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            head = fh.read(64)
    except (OSError, EOFError):
        return False
    return _TIMELINE_START.match(head) is not None


def read_trace_file(path: Path) -> Trace:
    """Read one trace file (compact or Chrome JSON); what goes wrong is a one-line
    ``ValueError``."""
    if path.name.endswith(PERFETTO_SUFFIX):
        raise ValueError(
            f"{path}: a Perfetto protobuf trace: stepscope writes these for Perfetto's UI but "
            "reads its compact form (.sstrace) and Chrome JSON; read the file it was made from"
        )
    try:
        if is_compact_trace(path):
            return read_compact_trace(path)
        return read_chrome_trace(path)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RecursionError:
        raise ValueError(f"{path}: not a trace: nested too deeply") from None
    except MemoryError:
        raise ValueError(f"{path}: too large to read into memory") from None


def trace_inputs(path: Path, stderr: TextIO) -> list[Path]:
    """The trace files at ``path``, memory timelines beside them left out (said on ``stderr``)."""
    files = trace_files(path)
    if path.is_dir():
        timelines = [f for f in files if is_memory_timeline(f)]
        if timelines:
            files = [f for f in files if f not in timelines]
            print(f"left out {len(timelines)} memory timeline file(s): not traces", file=stderr)
            if not files:
                raise ValueError(f"{path}: no trace files, only memory timelines")
    return files


def load_traces(
    path: Path,
    stderr: TextIO,
    keep: Callable[[Path], bool] | None = None,
    progress: ReadProgress | None = None,
) -> tuple[list[tuple[str, Trace]], list[str]]:
    """Read every trace at ``path`` (those ``keep`` accepts), telling ``progress`` as it goes.

    A single file that cannot be read raises ``ValueError``; in a directory, such files are
    listed as failures (one line each) and the others are read.
    """
    files = trace_inputs(path, stderr)
    if keep is not None:
        files = [f for f in files if keep(f)]
        if not files:
            raise ValueError(f"{path}: none of its trace files was chosen")
    single = len(files) == 1 and path.is_file()
    traces: list[tuple[str, Trace]] = []
    failures: list[str] = []
    if progress is not None:
        progress.start(len(files))
    try:
        for f in files:
            label = f.name if single or path.is_file() else str(f.relative_to(path))
            if progress is not None:
                progress.reading(printable(label))
            try:
                traces.append((label, read_trace_file(f)))
            except ValueError as exc:
                if single:
                    raise
                failures.append(str(exc))
            if progress is not None:
                progress.advance()
    finally:
        if progress is not None:
            progress.stop()
    if not traces:
        raise ValueError(f"{path}: none of its {len(files)} files could be read: {failures[0]}")
    return traces, failures
