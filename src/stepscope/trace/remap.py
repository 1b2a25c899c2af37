"""One trace's columns re-based for another trace's builder: string ids, labels, times, args refs.

``remapped`` uses the C ``remap_column`` (``_csrc/chrome_columns.c``) when the extension is
there; ``remapped_python`` is its twin.  ``TraceBuilder.add_trace`` merges with them.
"""

from __future__ import annotations

from array import array
from typing import Any

from stepscope._ext import native
from stepscope.trace.layouts import LABEL_BASE

__all__ = ["IDS", "LABELS", "REFS", "TIMES", "remapped", "remapped_python"]


IDS, LABELS, TIMES, REFS = 0, 1, 2, 3
"""Modes: string ids through a table; pid/tid labels (string ones through the table); times
plus an offset; args refs plus an offset (negative refs, -1 for none or a ``python_ids`` row,
stay as they are)."""

CODES = {IDS: "I", LABELS: "q", TIMES: "q", REFS: "i"}
"""The array typecode of each mode's column."""


def remapped_python(values: Any, mode: int, table: array[int] | None, offset: int) -> array[Any]:
    """Twin of the C ``remap_column``: the column re-based as an array."""
    code = CODES[mode]
    if mode == IDS:
        assert table is not None
        return array(code, map(table.__getitem__, values))
    if mode == LABELS:
        assert table is not None
        return array(
            code, (LABEL_BASE + table[v - LABEL_BASE] if v >= LABEL_BASE else v for v in values)
        )
    if mode == TIMES:
        return array(code, map(offset.__add__, values))
    return array(code, (v + offset if v >= 0 else v for v in values))


def remapped(values: Any, mode: int, table: array[int] | None, offset: int) -> array[Any]:
    """A column (memoryview or array of the mode's typecode) re-based as an array."""
    mod = native()
    if mod is None:
        return remapped_python(values, mode, table, offset)
    out = array(CODES[mode])
    out.frombytes(mod.remap_column(values, mode, table, offset))
    return out
