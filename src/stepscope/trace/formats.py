"""The trace file formats stepscope writes, by name: one writer per format and its suffix."""

from __future__ import annotations

import os
from collections.abc import Callable

from stepscope.trace.chrome_writer import WriteStats, write_chrome_trace
from stepscope.trace.compact_format import COMPACT_SUFFIX
from stepscope.trace.compact_writer import write_compact_trace
from stepscope.trace.model import Trace
from stepscope.trace.perfetto_writer import PERFETTO_SUFFIX, write_perfetto_trace

__all__ = ["FORMATS", "SUFFIXES", "check_format", "write_trace"]

Writer = Callable[[Trace, "str | os.PathLike[str]"], WriteStats]

FORMATS: dict[str, Writer] = {
    "chrome": write_chrome_trace,
    "compact": write_compact_trace,
    "perfetto": write_perfetto_trace,
}
"""Each format's writer (``chrome``: JSON, gzip when the path ends in ``.gz``)."""
SUFFIXES = {"chrome": ".json", "compact": COMPACT_SUFFIX, "perfetto": PERFETTO_SUFFIX}
"""Each format's file name suffix."""


def check_format(name: str) -> str:
    """``name`` if it is a format, else a ``ValueError`` listing them."""
    if name not in FORMATS:
        raise ValueError(f"unknown trace format {name!r}; choose one of: {', '.join(FORMATS)}")
    return name


def write_trace(trace: Trace, path: str | os.PathLike[str], format: str) -> WriteStats:
    """Write ``trace`` to ``path`` in ``format``."""
    return FORMATS[check_format(format)](trace, path)
