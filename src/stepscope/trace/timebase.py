"""The time base a trace file is written with: the whole second at or before its earliest event.

``column_min`` uses the C ``column_min`` (``_csrc/compact_columns.c``) when the extension is
built; ``column_min_python`` is its twin.  Both the Chrome and the compact writer take their
``baseTimeNanoseconds`` from :func:`file_base`, so their files read back to the same times.
"""

from __future__ import annotations

from typing import Any

from stepscope._ext import native
from stepscope.trace.model import Trace

__all__ = ["TIME_COLUMNS", "column_min", "column_min_python", "file_base"]

TIME_COLUMNS = (
    ("spans", "start_ns"),
    ("instants", "ts_ns"),
    ("counters", "ts_ns"),
    ("flows", "ts_ns"),
    ("samples", "ts_ns"),
)
"""The tables' event times (the columns a file's base is taken from)."""


def column_min_python(values: Any) -> int | None:
    """Twin of the C ``column_min``: the smallest value of an int64 column, None when empty."""
    return min(values, default=None)


def column_min(values: Any) -> int | None:
    """The smallest value of an int64 column (array or memoryview of ``q``), None when empty."""
    mod = native()
    if mod is None:
        return column_min_python(values)
    return mod.column_min(values)


def file_base(trace: Trace) -> int:
    """The written ``baseTimeNanoseconds``: the whole second at or before the earliest event."""
    lows = [column_min(trace.tables[table][col]) for table, col in TIME_COLUMNS]
    earliest = min((low for low in lows if low is not None), default=0)
    absolute = trace.base_time_ns + earliest
    return (absolute // 1_000_000_000) * 1_000_000_000
