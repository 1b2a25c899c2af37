"""The compact binary trace form (``.sstrace``): its layout, shared by its writer and reader.

A file is ``MAGIC``, a format version (one byte), then sections, each ``kind`` (one byte),
the payload's size before and after compression (varints), the CRC-32 of the compressed bytes
(4 bytes, little-endian) and the compressed payload, a raw deflate stream (RFC 1951; version 1:
a zlib stream); the last section is ``END`` (its payload: the number of sections before it), so
a truncated file is told from a whole one.

Sections: ``HEADER`` (JSON: base time, name, metadata, device properties, distributed info),
``STRINGS`` (the string table: a count, then each string's UTF-8 length and bytes), ``ARGS``
(version 2: the mappings as templates and integer columns, :mod:`stepscope.trace.compact_args`;
version 1: a count, then each mapping's key count, length and compact JSON text), and any
number of ``BLOCK`` sections: one table's rows (up to ``BLOCK_ROWS``) as columns of varints
(:mod:`stepscope.trace.compact_varint`), each column's coding in ``COLUMN_CODING``; time
columns and ids that grow are delta-coded, floats are 8 raw bytes.  What a Chrome file holds
is what this form holds: spans' ``python_ids`` args and empty args are left out as the Chrome
writer leaves them out, so both read back to the same trace.  The reader reads versions 1 to
``VERSION``.
"""

from __future__ import annotations

__all__ = [
    "ARGS",
    "BLOCK",
    "BLOCK_ROWS",
    "BLOCK_TABLES",
    "COLUMN_CODING",
    "COMPACT_SUFFIX",
    "END",
    "HEADER",
    "MAGIC",
    "STRINGS",
    "VERSION",
    "CompactTraceError",
    "varint",
]

MAGIC = b"\x89SSTRACE\r\n\x1a\n"
"""The first bytes of every compact trace (a PNG-style signature: binary, never text)."""
VERSION = 2
COMPACT_SUFFIX = ".sstrace"
"""The file name suffix of the compact form."""

HEADER, STRINGS, ARGS, BLOCK, END = b"H", b"S", b"A", b"B", b"E"
BLOCK_ROWS = 1 << 16
"""Rows per block: memory per block stays bounded and a damaged block names its table."""

BLOCK_TABLES = ("spans", "instants", "counters", "flows", "meta", "samples", "frames", "stacks")
"""The tables written, by their index in a block's payload (``python_ids`` is not written)."""

# (typecode, delta-coded); "d" columns are raw little-endian doubles.
COLUMN_CODING: dict[str, tuple[str, bool]] = {
    "pid": ("q", True),
    "tid": ("q", True),
    "start_ns": ("q", True),
    "ts_ns": ("q", True),
    "args": ("i", True),
    "flow_id": ("q", True),
    "parent": ("i", True),
    "frame": ("i", True),
    "stack": ("i", True),
}
"""Columns coded other than as their layout's typecode without deltas."""


class CompactTraceError(ValueError):
    """A compact trace could not be read: names the file and what is wrong with it."""


def varint(value: int) -> bytes:
    """A non-negative integer as a LEB128 varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
