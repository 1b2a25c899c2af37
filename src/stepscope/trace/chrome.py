"""Chrome trace files in the Kineto dialect: the writer and the reader under one name.

The code lives in ``chrome_writer`` and ``chrome_reader``; the JSON encoder in
``stepscope.jsonenc``.  This module keeps the names importable from where they used to be.
"""

from __future__ import annotations

from stepscope.jsonenc import json_bytes
from stepscope.trace.chrome_reader import (
    MAX_INFLATE_RATIO,
    MIN_INFLATE_LIMIT,
    ChromeTraceError,
    read_chrome_trace,
    spans_from_events_python,
)
from stepscope.trace.chrome_writer import (
    CHUNK_EVENTS,
    RESERVED_KEYS,
    WriteStats,
    format_spans_python,
    write_chrome_trace,
)

__all__ = [
    "CHUNK_EVENTS",
    "MAX_INFLATE_RATIO",
    "MIN_INFLATE_LIMIT",
    "RESERVED_KEYS",
    "ChromeTraceError",
    "WriteStats",
    "format_spans_python",
    "json_bytes",
    "read_chrome_trace",
    "spans_from_events_python",
    "write_chrome_trace",
]
