"""The step tables' columns (version 2): one row per step per rank, hive-partitioned by run and
rank so DuckDB, Spark or Trino read ``DIR/**/*.parquet`` unchanged."""

from __future__ import annotations

import re
from typing import Any

from stepscope.extras import require

__all__ = [
    "ADDED_IN_2",
    "COLUMNS",
    "INT_COLUMNS",
    "SCHEMA_VERSION",
    "arrow_schema",
    "partition_value",
]

SCHEMA_VERSION = 2
"""Bumped when columns are added (at the end) or one changes meaning or type.  Version 2 added
``collective_ns`` and ``busy_ns``."""

INT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("step", "the step number (the profiler's, shared by every rank)"),
    ("start_unix_ns", "when the step began, Unix ns (the rank's clock)"),
    ("duration_ns", "the loop body: from step() returning to the next step() call"),
    ("data_wait_ns", "in the DataLoader iterator's __next__ (waiting for the batch)"),
    ("optimizer_ns", "in torch.optim.Optimizer.step()"),
    ("gc_ns", "in Python garbage collections"),
    ("cpu_ns", "CPU time of the thread that calls step() (the training loop's)"),
    ("rss_bytes", "resident set size, sampled every 20 ms by the writer thread"),
)
"""The int64 columns, in buffer order, with what each holds."""

COLUMNS: tuple[tuple[str, str], ...] = (
    *INT_COLUMNS,
    ("recorded", "bool: the schedule recorded this step (a trace window covers it)"),
    ("host", "string: the host name"),
    ("pid", "int32: the process id"),
    ("schema_version", "int16: this schema's version (1)"),
    ("host_computation_ns", "int64, recorded steps: host time with a span open, no collective"),
    ("host_communication_ns", "int64, recorded steps: host time with a collective in flight"),
    ("host_idle_ns", "int64, recorded steps: host time with nothing open"),
    ("host_categories", "map<string, int64>, recorded steps: the step's host time by category"),
    ("collective_ns", "int64: time with a collective of this process in flight (version 2)"),
    ("busy_ns", "int64: duration_ns - collective_ns, the step's own time (version 2)"),
)
"""Every column of a step table file (``run`` and ``rank`` come from the directory names)."""

ADDED_IN_2 = ("collective_ns", "busy_ns")
"""Columns a version-1 file lacks (read as null from it)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def partition_value(value: str) -> str:
    """``value`` made safe for a hive directory name (``run=<value>``)."""
    cleaned = _UNSAFE.sub("_", value).strip(".")
    return cleaned or "_"


def arrow_schema() -> Any:
    """The pyarrow schema of one file, with the version in its metadata."""
    pa = require("pyarrow", "step tables", "parquet")
    fields = [pa.field(name, pa.int64(), nullable=False) for name, _ in INT_COLUMNS]
    fields += [
        pa.field("recorded", pa.bool_(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("pid", pa.int32(), nullable=False),
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("host_computation_ns", pa.int64()),
        pa.field("host_communication_ns", pa.int64()),
        pa.field("host_idle_ns", pa.int64()),
        pa.field("host_categories", pa.map_(pa.string(), pa.int64())),
        pa.field("collective_ns", pa.int64(), nullable=False),
        pa.field("busy_ns", pa.int64(), nullable=False),
    ]
    return pa.schema(fields, metadata={"stepscope.step_tables.version": str(SCHEMA_VERSION)})
