"""Column layouts of the trace model's tables (see :mod:`stepscope.trace.model`)."""

from __future__ import annotations

LABEL_BASE = 1 << 62
"""pid/tid values at or above this encode a string label (``LABEL_BASE + string id``)."""

SCHEMA_VERSION = 1

# Column layouts: (column name, array typecode).  ``args`` holds -1 (none), an index into
# Trace.args, or ``-2 - row`` of the ``python_ids`` table (see ``python_ids_ref``).
SPAN_COLUMNS = (
    ("name", "I"),
    ("cat", "I"),
    ("pid", "q"),
    ("tid", "q"),
    ("start_ns", "q"),
    ("dur_ns", "q"),
    ("args", "i"),
)
INSTANT_COLUMNS = (
    ("name", "I"),
    ("cat", "I"),
    ("pid", "q"),
    ("tid", "q"),
    ("ts_ns", "q"),
    ("scope", "B"),  # ord of 't', 'p' or 'g'
    ("args", "i"),
)
# One row per (event, series): rows with first == 0 continue the previous event's args.
COUNTER_COLUMNS = (
    ("name", "I"),
    ("pid", "q"),
    ("tid", "q"),
    ("ts_ns", "q"),
    ("series", "I"),
    ("value", "d"),
    ("first", "B"),
)
FLOW_COLUMNS = (
    ("name", "I"),
    ("cat", "I"),
    ("pid", "q"),
    ("tid", "q"),
    ("ts_ns", "q"),
    ("flow_id", "q"),
    ("phase", "B"),  # ord of 's', 't' or 'f'
    ("binding", "B"),  # ord('e') for enclosing-slice binding, else 0
)
# ``M`` events: process_name, thread_name, process_labels, *_sort_index ...; value in args.
META_COLUMNS = (
    ("name", "I"),
    ("pid", "q"),
    ("tid", "q"),
    ("args", "i"),
)
SAMPLE_COLUMNS = (
    ("pid", "q"),
    ("tid", "q"),
    ("ts_ns", "q"),
    ("stack", "i"),  # index into the stacks table, -1 for an empty stack
    ("weight", "q"),
    ("idle", "B"),
)
FRAME_COLUMNS = (
    ("name", "I"),
    ("file", "I"),
    ("line", "i"),
)
STACK_COLUMNS = (
    ("parent", "i"),  # -1 at the root
    ("frame", "i"),
)
# The function tracer's span args as columns: a span whose args ref is ``-2 - row`` has args
# ``{"Python id": id, "Python parent id": parent or None}`` (no dict per span until asked).
PYTHON_ID_COLUMNS = (
    ("id", "q"),
    ("parent", "q"),
)

TABLE_LAYOUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "spans": SPAN_COLUMNS,
    "instants": INSTANT_COLUMNS,
    "counters": COUNTER_COLUMNS,
    "flows": FLOW_COLUMNS,
    "meta": META_COLUMNS,
    "samples": SAMPLE_COLUMNS,
    "frames": FRAME_COLUMNS,
    "stacks": STACK_COLUMNS,
    "python_ids": PYTHON_ID_COLUMNS,
}


def python_ids_ref(row: int) -> int:
    """The ``args`` column value of a span whose args are row ``row`` of ``python_ids``."""
    return -2 - row
