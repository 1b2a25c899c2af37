"""The compact binary trace form: the reader (layout in :mod:`stepscope.trace.compact_format`).

Every section is checked (its CRC-32, its sizes, every count against the bytes there) before it
is used, so a damaged or truncated file is one ``CompactTraceError`` naming the file and what is
wrong, never a traceback from inside.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from array import array
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stepscope.trace.compact_args import splice_args
from stepscope.trace.compact_format import (
    ARGS,
    BLOCK,
    BLOCK_TABLES,
    COLUMN_CODING,
    END,
    HEADER,
    MAGIC,
    STRINGS,
    VERSION,
    CompactTraceError,
)
from stepscope.trace.compact_varint import unpack_column
from stepscope.trace.layouts import TABLE_LAYOUTS
from stepscope.trace.model import Table, Trace
from stepscope.trace.raw_args import RawArgs

__all__ = ["MAX_SECTION_BYTES", "is_compact_trace", "read_compact_trace"]

MAX_SECTION_BYTES = 1 << 31
"""The most bytes one section may inflate to (blocks hold at most 65536 rows: far less)."""


class _Bad(Exception):
    """A malformed part, said in words; turned into a ``CompactTraceError`` with the file."""


class _Cursor:
    """Reads varints and byte runs from a payload, raising ``_Bad`` past its end."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.at, self.what = data, 0, what

    def varint(self) -> int:
        value, shift, data = 0, 0, self.data
        while True:
            if self.at >= len(data) or shift > 63:
                raise _Bad(f"{self.what}: a number runs past its end")
            b = data[self.at]
            self.at += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.at:
            raise _Bad(f"{self.what}: {n} bytes announced, {len(self.data) - self.at} there")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def done(self) -> None:
        if self.at != len(self.data):
            raise _Bad(f"{self.what}: {len(self.data) - self.at} bytes left over")


def is_compact_trace(path: Path) -> bool:
    """Whether the file at ``path`` starts as a compact trace."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _version(raw: bytes) -> int:
    if raw[: len(MAGIC)] != MAGIC:
        raise _Bad("not a compact trace (its first bytes are not the compact form's signature)")
    if len(raw) <= len(MAGIC):
        raise _Bad("truncated: the file ends after its signature")
    version = raw[len(MAGIC)]
    if not 1 <= version <= VERSION:
        raise _Bad(
            f"compact trace format version {version}, this stepscope reads versions 1 to "
            f"{VERSION}: upgrade stepscope"
        )
    return version


def _sections(raw: bytes, version: int) -> list[tuple[bytes, bytes]]:
    cur = _Cursor(raw, "file")
    cur.at = len(MAGIC) + 1
    sections: list[tuple[bytes, bytes]] = []
    while True:
        if cur.at >= len(raw):
            raise _Bad(
                f"truncated: the file ends at byte {len(raw)} after {len(sections)} sections, "
                "without its end marker (was the write cut short?)"
            )
        start = cur.at
        kind = cur.take(1)
        size, packed = cur.varint(), cur.varint()
        if size > MAX_SECTION_BYTES:
            raise _Bad(f"section at byte {start}: announces {size} bytes, more than any writes")
        try:
            (crc,) = struct.unpack("<I", cur.take(4))
            data = cur.take(packed)
        except _Bad:
            raise _Bad(
                f"truncated: section at byte {start} runs past the end of the file "
                f"({len(raw)} bytes)"
            ) from None
        if zlib.crc32(data) != crc:
            raise _Bad(f"damaged: section at byte {start} fails its checksum")
        try:
            decomp = zlib.decompressobj(-15 if version > 1 else 15)  # v1: zlib-wrapped
            payload = decomp.decompress(data, size + 1)
        except zlib.error as exc:
            raise _Bad(f"damaged: section at byte {start} does not inflate ({exc})") from None
        if len(payload) != size or not decomp.eof or decomp.unused_data:
            raise _Bad(f"damaged: section at byte {start} inflates to another size than announced")
        if kind == END:
            end = _Cursor(payload, "end marker")
            if end.varint() != len(sections):
                raise _Bad("damaged: the end marker counts another number of sections")
            if cur.at != len(raw):
                raise _Bad(f"{len(raw) - cur.at} bytes of trailing data after the end marker")
            return sections
        sections.append((kind, payload))


def _numbers(cur: _Cursor, count: int) -> array[int]:
    size = cur.varint()
    data = cur.take(size)
    try:
        values, end = unpack_column(data, 0, count, "q", False)
    except ValueError as exc:
        raise _Bad(f"{cur.what}: {exc}") from None
    if end != size:
        raise _Bad(f"{cur.what}: bytes left over after its lengths")
    return array("q", values)


def _texts(payload: bytes, what: str, sized: bool) -> tuple[list[bytes], array[int]]:
    """The texts of a strings or version-1 args section (and their sizes: ``sized``)."""
    cur = _Cursor(payload, what)
    count = cur.varint()
    lengths = _numbers(cur, count)
    sizes = _numbers(cur, count) if sized else lengths
    if sum(lengths) != len(payload) - cur.at:
        raise _Bad(f"{what}: its lengths do not add up to its bytes")
    texts, at = [], cur.at
    for n in lengths:
        texts.append(payload[at : at + n])
        at += n
    return texts, sizes


def _strings(payload: bytes) -> tuple[str, ...]:
    return tuple(t.decode("utf-8") for t in _texts(payload, "string table", False)[0])


def _args(payload: bytes, version: int) -> tuple[Any, ...]:
    if version == 1:
        texts, sizes = _texts(payload, "args table", True)
    else:
        try:
            texts, sizes = splice_args(payload)
        except ValueError as exc:
            raise _Bad(f"damaged: {exc}") from None
    if any(t[:1] != b"{" for t in texts):
        raise _Bad("args table: an entry is not a JSON object")
    return tuple(map(RawArgs, texts, sizes))


def _block(payload: bytes, columns: dict[str, dict[str, array[Any]]]) -> None:
    cur = _Cursor(payload, "block")
    index = cur.varint()
    if index >= len(BLOCK_TABLES):
        raise _Bad(f"block of unknown table #{index}")
    table = BLOCK_TABLES[index]
    cur.what = f"block of {table}"
    rows = cur.varint()
    staged = []
    for name, code in TABLE_LAYOUTS[table]:
        if code == "d":
            column = array("d")
            column.frombytes(cur.take(8 * rows))
            if sys.byteorder == "big":
                column.byteswap()
        else:
            coded, delta = COLUMN_CODING.get(name, (code, False))
            size = cur.varint()
            data = cur.take(size)
            try:
                values, end = unpack_column(data, 0, rows, coded, delta)
            except ValueError as exc:
                raise _Bad(f"block of {table}: column {name}: {exc}") from None
            if end != size:
                raise _Bad(f"block of {table}: column {name} has bytes left over")
            column = array(code)
            column.frombytes(values)
        staged.append((name, column))
    cur.done()
    for name, column in staged:
        columns[table][name].extend(column)


def _check_refs(trace: Trace) -> None:
    """Every id a column holds points into its table (else a later read would fail deep)."""
    strings, args = len(trace.strings), len(trace.args)
    for table, layout in TABLE_LAYOUTS.items():
        t = trace.tables[table]
        if not len(t):
            continue
        for name, _ in layout:
            col = t[name]
            if name in ("name", "cat", "series", "file") and max(col) >= strings:
                raise _Bad(f"{table}: a {name} beyond the string table")
            if name == "args" and (max(col) >= args or min(col) < -1):
                raise _Bad(f"{table}: an args reference beyond the args table")
    stacks, frames = trace.tables["stacks"], len(trace.tables["frames"])
    if len(stacks) and (max(stacks["frame"]) >= frames or min(stacks["frame"]) < 0):
        raise _Bad("stacks: a frame beyond the frames table")
    if any(p >= i for i, p in enumerate(stacks["parent"])):
        raise _Bad("stacks: a parent that is not an earlier stack")
    samples = trace.samples["stack"]
    if len(samples) and (max(samples) >= len(stacks) or min(samples) < -1):
        raise _Bad("samples: a stack beyond the stacks table")


def _trace(sections: list[tuple[bytes, bytes]], version: int) -> Trace:
    kinds = [kind for kind, _ in sections[:3]]
    if kinds != [HEADER, STRINGS, ARGS]:
        raise _Bad("damaged: the header, string and args sections are not where they belong")
    try:
        head = json.loads(sections[0][1])
    except ValueError as exc:
        raise _Bad(f"damaged header: {exc}") from None
    if not isinstance(head, dict) or not isinstance(head.get("base_time_ns"), int):
        raise _Bad("damaged header: no base time")
    strings, args = _strings(sections[1][1]), _args(sections[2][1], version)
    columns = {t: {name: array(code) for name, code in lay} for t, lay in TABLE_LAYOUTS.items()}
    for kind, payload in sections[3:]:
        if kind != BLOCK:
            raise _Bad(f"a section of unknown kind {kind!r}")
        _block(payload, columns)
    dist = head.get("distributed_info")
    trace = Trace(
        strings=strings,
        tables=MappingProxyType({t: Table(TABLE_LAYOUTS[t], c) for t, c in columns.items()}),
        args=args,
        base_time_ns=head["base_time_ns"],
        metadata=MappingProxyType(dict(head.get("metadata") or {})),
        device_properties=tuple(head.get("device_properties") or ()),
        distributed_info=dist if isinstance(dist, dict) else None,
        trace_name=head.get("trace_name") if isinstance(head.get("trace_name"), str) else None,
        display_time_unit=str(head.get("display_time_unit", "ms")),
        schema_version=int(head.get("schema_version", 1)),
    )
    _check_refs(trace)
    return trace


def read_compact_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a compact trace (``.sstrace``); every failure is a ``CompactTraceError``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise CompactTraceError(f"{p}: no such trace file") from None
    except IsADirectoryError:
        raise CompactTraceError(f"{p}: is a directory, not a trace file") from None
    try:
        version = _version(raw)
        return _trace(_sections(raw, version), version)
    except _Bad as exc:
        raise CompactTraceError(f"{p}: {exc}") from None
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise CompactTraceError(f"{p}: damaged: {type(exc).__name__}: {exc}") from None
