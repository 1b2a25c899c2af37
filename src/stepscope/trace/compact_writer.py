"""The compact binary trace form: the writer (layout in :mod:`stepscope.trace.compact_format`).

The trace's tables are written column by column in blocks of ``BLOCK_ROWS`` rows, each column
as varints (times and growing ids delta-coded), each block zlib-compressed; times are rebased to
the whole second before the earliest event, as the Chrome writer does, so the file reads back to
the same ``Trace`` that the Chrome file of the same window reads back to.  The file appears
under its name only once complete (``atomic_output``).
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from typing import Any, NamedTuple

from stepscope.atomic import atomic_output, ensure_parent
from stepscope.jsonenc import json_bytes, utf8
from stepscope.trace.chrome_writer import WriteStats
from stepscope.trace.chrome_writer import _file_base as file_base
from stepscope.trace.compact_format import (
    ARGS,
    BLOCK,
    BLOCK_ROWS,
    BLOCK_TABLES,
    COLUMN_CODING,
    END,
    HEADER,
    MAGIC,
    STRINGS,
    VERSION,
    varint,
)
from stepscope.trace.compact_varint import pack_column
from stepscope.trace.layouts import TABLE_LAYOUTS
from stepscope.trace.model import Trace
from stepscope.trace.remap import TIMES, remapped

__all__ = ["DEFAULT_LEVEL", "compact_sections", "write_compact_trace"]

DEFAULT_LEVEL = 6
"""zlib level of each block (6: most of level 9's size at a fraction of its time)."""
_TIME_COLUMNS = ("start_ns", "ts_ns")


def _section(kind: bytes, payload: bytes, level: int) -> bytes:
    packed = zlib.compress(payload, level)
    return b"".join(
        (
            kind,
            varint(len(payload)),
            varint(len(packed)),
            struct.pack("<I", zlib.crc32(packed)),
            packed,
        )
    )


def _header(trace: Trace, base: int, name: str) -> bytes:
    return json_bytes(
        {
            "base_time_ns": base,
            "trace_name": name,
            "display_time_unit": trace.display_time_unit,
            "schema_version": trace.schema_version,
            "metadata": dict(trace.metadata),
            "device_properties": list(trace.device_properties),
            "distributed_info": (
                dict(trace.distributed_info) if trace.distributed_info is not None else None
            ),
        }
    )


def _texts(texts: list[bytes], sizes: array[int] | None = None) -> bytes:
    """A count, each text's length (and ``sizes``) as varints, then the texts one after another."""
    lengths = pack_column(array("q", map(len, texts)), "q", False)
    parts = [varint(len(texts)), varint(len(lengths)), lengths]
    if sizes is not None:
        packed = pack_column(sizes, "q", False)
        parts += [varint(len(packed)), packed]
    return b"".join((*parts, *texts))


def _strings(trace: Trace) -> bytes:
    return _texts([utf8(s) for s in trace.strings])


def _args(trace: Trace, sizes: array[int], extra: list[bytes]) -> bytes:
    texts = [json_bytes(args) for args in trace.args] + extra
    return _texts(texts, sizes + array("q", [0] * len(extra)))


def _column_refs(table: str, refs: Any, lo: int, hi: int, empty: _Empty) -> Any:
    """The args refs as the Chrome file keeps them: a span's empty or ``python_ids`` args are
    none (-1); a metadata event without args has empty ones (``empty.ref``)."""
    if table == "spans":
        if empty.refs:
            return array("i", (-1 if r < 0 or r in empty else r for r in refs[lo:hi]))
    elif table == "meta":
        return array("i", (empty.ref if r < 0 else r for r in refs[lo:hi]))
    return refs[lo:hi]


class _Empty(NamedTuple):
    refs: frozenset[int]
    """The args refs of empty mappings."""
    ref: int
    """The ref of the empty mapping added for metadata events without args."""


def _block(trace: Trace, index: int, lo: int, hi: int, shift: int, empty: _Empty) -> bytes:
    table = BLOCK_TABLES[index]
    cols = trace.tables[table]
    parts = [varint(index), varint(hi - lo)]
    for name, code in TABLE_LAYOUTS[table]:
        values: Any = cols[name][lo:hi]
        if code == "d":
            data = array("d", values)
            if sys.byteorder == "big":
                data.byteswap()
            parts.append(data.tobytes())
            continue
        if name in _TIME_COLUMNS and shift:
            values = remapped(values, TIMES, None, shift)
        elif name == "args":
            values = _column_refs(table, cols[name], lo, hi, empty)
        coded, delta = COLUMN_CODING.get(name, (code, False))
        packed = pack_column(values, coded, delta, -1 if name == "args" else -(2**63))
        parts.append(varint(len(packed)))
        parts.append(packed)
    return b"".join(parts)


def _rebased(trace: Trace) -> tuple[int, int]:
    """The written base and the shift of every time.  A base of whole seconds is a file's (the
    Chrome writer's, or Kineto's 0): it is kept, so the times stay exactly as they were read;
    any other (a window's wall base under monotonic times) becomes the whole second before the
    earliest event, as the Chrome writer writes it.  Either way the file reads back to what the
    Chrome file of the same window reads back to, and analyses see the same numbers."""
    if trace.base_time_ns % 1_000_000_000 == 0:
        return trace.base_time_ns, 0
    base = file_base(trace)
    return base, trace.base_time_ns - base


def compact_sections(trace: Trace, name: str, level: int = DEFAULT_LEVEL) -> Iterator[bytes]:
    """The file's bytes after ``MAGIC`` and the version, section by section."""
    base, shift = _rebased(trace)
    meta_refs = trace.meta["args"]
    extra = [b"{}"] if len(meta_refs) and min(meta_refs) < 0 else []
    sizes = array("q", map(len, trace.args))
    empties = frozenset(i for i, size in enumerate(sizes) if not size) if 0 in sizes else ()
    empty = _Empty(frozenset(empties), len(trace.args))
    count = 0
    for kind, payload in (
        (HEADER, _header(trace, base, name)),
        (STRINGS, _strings(trace)),
        (ARGS, _args(trace, sizes, extra)),
    ):
        yield _section(kind, payload, level)
        count += 1
    for index, table in enumerate(BLOCK_TABLES):
        rows = len(trace.tables[table])
        for lo in range(0, rows, BLOCK_ROWS):
            hi = min(rows, lo + BLOCK_ROWS)
            yield _section(BLOCK, _block(trace, index, lo, hi, shift, empty), level)
            count += 1
    yield _section(END, varint(count), level)


def write_compact_trace(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    level: int = DEFAULT_LEVEL,
    fsync: bool = False,
) -> WriteStats:
    """Write ``trace`` to ``path`` in the compact form, atomically; returns its sizes."""
    if not 0 <= level <= 9:
        raise ValueError(f"level must be between 0 and 9, got {level}")
    target = ensure_parent(path, "trace")
    name = trace.trace_name if trace.trace_name is not None else str(target)
    with atomic_output(target, what="trace", fsync=fsync) as fh:
        fh.write(MAGIC + bytes((VERSION,)))
        written = len(MAGIC) + 1
        for chunk in compact_sections(trace, name, level):
            fh.write(chunk)
            written += len(chunk)
    return WriteStats(str(target), trace.event_count(), written)
