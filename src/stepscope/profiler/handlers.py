"""Trace handlers for ``on_trace_ready``: write each window to a directory of trace files.

A ``trace_handler`` only writes a file: its ``saves_off_loop`` lets the profile build and write
each window on its writer thread, while the training loop goes on (``writer.py``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from stepscope import clock
from stepscope.atomic import make_directory
from stepscope.distributed import rank_and_world_size
from stepscope.failures import failure_log
from stepscope.trace.model import Trace

__all__ = [
    "TraceHandler",
    "default_worker_name",
    "tensorboard_trace_handler",
    "trace_handler",
    "write_failures",
]

_failures = failure_log("handlers")


def write_failures() -> dict[str, int]:
    """How many trace files trace handlers could not write in this process."""
    return {k: n for k, n in _failures.counts().items() if k == "trace_write_error"}


def default_worker_name() -> str:
    """``{hostname}_{pid}``, plus ``_rank{r}`` when a distributed rank is known."""
    name = f"{socket.gethostname()}_{os.getpid()}"
    rank, _ = rank_and_world_size()
    return f"{name}_rank{rank}" if rank is not None else name


class TraceSource(Protocol):
    """What a handler needs of a profile: its trace written to a path, and the list of the
    files written (its ``strict`` switch, where it has one, decides whether a failed write is
    re-raised)."""

    trace_files: list[str]

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> object: ...

    def trace(self) -> Trace: ...


class TraceHandler:
    """``on_trace_ready`` writing ``{worker}.{unix_ns}.pt.trace<suffix>`` into a directory."""

    saves_off_loop = True
    """It only writes a file: the profile may call it on its writer thread, off the loop."""

    def __init__(
        self, directory: Path, worker_name: str | None, use_gzip: bool, format: str
    ) -> None:
        self.directory = directory
        self.worker_name = worker_name
        self.use_gzip = use_gzip
        self.format = format

    def __call__(self, prof: TraceSource) -> str | None:
        """Write the window's trace; its path, or None if the write failed (counted, logged)."""
        from stepscope.trace.formats import SUFFIXES, write_trace

        worker = self.worker_name or default_worker_name()
        stamp = clock.to_unix_ns(clock.now_ns())
        suffix = SUFFIXES[self.format] + (".gz" if self.use_gzip else "")
        path = self.directory / f"{worker}.{stamp}.pt.trace{suffix}"
        try:
            make_directory(self.directory, "trace_handler", "trace directory")
            if self.format == "chrome":
                prof.export_chrome_trace(path)
            else:
                prof.trace_files.append(write_trace(prof.trace(), path, self.format).path)
        except OSError as exc:
            # A full disk or a vanished directory must not end a long training run; the
            # profile's own strict= (None: config.strict) decides whether it is re-raised.
            _failures.report(
                "trace_write_error",
                str(self.directory),
                exc,
                strict=getattr(prof, "strict", None),
                then="the window is not saved",
            )
            return None
        return str(path)


def trace_handler(
    dir_name: str | os.PathLike[str],
    worker_name: str | None = None,
    use_gzip: bool = False,
    format: str = "chrome",
) -> Callable[[TraceSource], str | None]:
    """``on_trace_ready`` writing ``{worker}.{unix_ns}.pt.trace.json[.gz]`` into ``dir_name``;
    ``format="compact"`` writes ``.pt.trace.sstrace``, ``"perfetto"`` ``.pt.trace.pftrace``."""
    from stepscope.trace.formats import check_format

    check_format(format)
    if use_gzip and format != "chrome":
        raise ValueError(
            f"use_gzip=True is for Chrome JSON; format {format!r} is compressed already"
        )
    directory = Path(dir_name)
    make_directory(directory, "trace_handler", "trace directory")
    if worker_name is not None and (not worker_name or "/" in worker_name):
        raise ValueError(f"worker_name must be a non-empty file name part, got {worker_name!r}")
    return TraceHandler(directory, worker_name, use_gzip, format)


tensorboard_trace_handler = trace_handler
