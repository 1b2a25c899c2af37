"""The compact binary trace form: the writer (layout in :mod:`stepscope.trace.compact_format`).

The trace's tables are written column by column in blocks of ``BLOCK_ROWS`` rows, each column
as varints (times and growing ids delta-coded), each block deflated; times are rebased to
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
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stepscope.atomic import atomic_output, ensure_parent
from stepscope.jsonenc import json_bytes, utf8
from stepscope.trace.chrome_writer import WriteStats
from stepscope.trace.compact_args import split_args
from stepscope.trace.compact_deflate import Deflater, Parts
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
from stepscope.trace.timebase import file_base

__all__ = ["DEFAULT_LEVEL", "compact_sections", "write_compact_trace"]

DEFAULT_LEVEL = 1
"""zlib level of each section (1: varint columns compress nearly as well as at 6, 5-20x
faster)."""
PARALLEL_BYTES = 1 << 18
"""Payloads from this size on are compressed on worker threads while the next are encoded
(from the second one on, and where there is more than one core)."""
_WORKERS = max(0, min(4, (os.cpu_count() or 1) - 1))
_TIME_COLUMNS = ("start_ns", "ts_ns")
_FLAGGED = frozenset(("start_ns", "ts_ns", "dur_ns", "value"))
"""Columns whose values may hardly repeat (a torch window's times): see ``Deflater``."""


def _section(kind: bytes, parts: Parts, deflater: Deflater) -> bytes:
    packed = deflater.stream(parts)
    return b"".join(
        (
            kind,
            varint(sum(len(data) for data, _ in parts)),
            varint(len(packed)),
            struct.pack("<I", zlib.crc32(packed)),
            packed,
        )
    )


def _pooled_section(kind: bytes, parts: Parts, level: int) -> bytes:
    """A section compressed on a worker thread (its own compressor: a large payload's)."""
    return _section(kind, parts, Deflater(level))


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


def _strings(trace: Trace) -> bytes:
    """A count, each string's UTF-8 length as varints, then the strings one after another."""
    texts = [utf8(s) for s in trace.strings]
    packed = pack_column(array("q", map(len, texts)), "q", False)
    return b"".join((varint(len(texts)), varint(len(packed)), packed, *texts))


def _meta_refs(refs: Any, empty_ref: int) -> array[int]:
    """A metadata event without args has empty ones (``empty_ref``), as the Chrome file has."""
    return array("i", (empty_ref if r < 0 else r for r in refs))


def _block(
    trace: Trace, index: int, lo: int, hi: int, shift: int, sizes: array[int], empty_ref: int
) -> Parts:
    """One block's payload; ``sizes``: each mapping's key count (a span's args ref to an
    empty mapping, like a ``python_ids`` ref, is written as none, as the Chrome writer leaves
    them out)."""
    table = BLOCK_TABLES[index]
    cols = trace.tables[table]
    parts: Parts = [(varint(index) + varint(hi - lo), False)]
    for name, code in TABLE_LAYOUTS[table]:
        values: Any = cols[name][lo:hi]
        if code == "d":
            data = array("d", values)
            if sys.byteorder == "big":
                data.byteswap()
            parts.append((data.tobytes(), name in _FLAGGED))
            continue
        empty = None
        if name in _TIME_COLUMNS and shift:
            values = remapped(values, TIMES, None, shift)
        elif name == "args" and table == "meta":
            values = _meta_refs(values, empty_ref)
        elif name == "args" and table == "spans":
            empty = sizes
        coded, delta = COLUMN_CODING.get(name, (code, False))
        packed = pack_column(values, coded, delta, -1 if name == "args" else -(2**63), empty)
        parts += ((varint(len(packed)), False), (packed, name in _FLAGGED))
    return parts


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
    extra = bool(len(meta_refs)) and min(meta_refs) < 0
    # the ARGS payload (:mod:`stepscope.trace.compact_args`), an empty mapping after the trace's
    # own where metadata events have no args (the Chrome file gives them empty ones)
    args, sizes = split_args((*trace.args, {}) if extra else trace.args)

    def payloads() -> Iterator[tuple[bytes, Parts]]:
        yield HEADER, [(_header(trace, base, name), False)]
        yield STRINGS, [(_strings(trace), False)]
        yield ARGS, [(args, False)]
        for index, table in enumerate(BLOCK_TABLES):
            rows = len(trace.tables[table])
            for lo in range(0, rows, BLOCK_ROWS):
                hi = min(rows, lo + BLOCK_ROWS)
                yield BLOCK, _block(trace, index, lo, hi, shift, sizes, len(trace.args))

    deflater = Deflater(level)
    count = 0
    for section in _compressed(payloads(), deflater):
        yield section
        count += 1
    yield _section(END, [(varint(count), False)], deflater)


def _compressed(payloads: Iterator[tuple[bytes, Parts]], deflater: Deflater) -> Iterator[bytes]:
    """Each payload as its section, in order.  Large ones are compressed on a few threads
    (zlib releases the GIL) while the next are encoded, once a second one comes (and where
    there is more than one core): a pool costs more to start than one payload's compression
    can overlap, so a window's args or a small trace's blocks are compressed inline.  A large
    payload that comes while every worker has one is compressed by this thread, beside them;
    so at most ``_WORKERS`` wait for a thread at a time, and memory stays bounded."""
    # each entry: [its section (bytes), a thread's future, or None while held back; on a thread]
    pending: deque[list[Any]] = deque()
    pool: ThreadPoolExecutor | None = None
    held: tuple[list[Any], bytes, Parts] | None = None  # the first large payload, until a second
    pooled = 0
    try:
        for kind, payload in payloads:
            if sum(len(data) for data, _ in payload) < PARALLEL_BYTES or not _WORKERS:
                pending.append([_section(kind, payload, deflater), False])
            elif pool is None and held is None:
                held = ([None, True], kind, payload)
                pending.append(held[0])
                pooled += 1
            else:
                if pool is None and held is not None:
                    pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="stepscope-compact")
                    held[0][0] = pool.submit(_pooled_section, held[1], held[2], deflater.level)
                    held = None
                if pool is None or pooled >= _WORKERS:  # every worker has one: this thread too
                    pending.append([_section(kind, payload, deflater), False])
                else:
                    pending.append(
                        [pool.submit(_pooled_section, kind, payload, deflater.level), True]
                    )
                    pooled += 1
            while pending and pending[0][0] is not None:
                section = pending[0][0]
                if not isinstance(section, bytes):
                    if not section.done() and pooled <= _WORKERS:
                        break
                    section = section.result()
                pooled -= pending.popleft()[1]
                yield section
        if held is not None:  # a single large payload: compressed inline
            held[0][0] = _section(held[1], held[2], deflater)
        for entry in pending:
            yield entry[0] if isinstance(entry[0], bytes) else entry[0].result()
        pending.clear()
    finally:
        for entry in pending:
            if isinstance(entry[0], Future):
                entry[0].cancel()
        if pool is not None:
            pool.shutdown(wait=True)


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
