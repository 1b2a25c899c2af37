"""Sections of the compact trace form as raw deflate streams (layout in
:mod:`stepscope.trace.compact_format`), for the writer.

A section's payload comes in pieces (``Parts``), the columns of times or doubles flagged; a
``Deflater`` compresses a whole write's sections with one compressor per level, each
section ending as a stream of its own that ``zlib.decompressobj(-15)`` inflates.  The
compressor is zlib-ng's where it is installed (the ``fast`` extra: the same raw deflate
streams, from 1.5 to 3 times faster), else zlib's.
"""

from __future__ import annotations

import importlib
import zlib
from types import ModuleType
from typing import Any


def _fastest() -> ModuleType:
    try:
        return importlib.import_module("zlib_ng.zlib_ng")
    except ImportError:  # the standard library's: slower, the same format
        return zlib


_compressor = _fastest()

__all__ = ["COMPRESSOR", "FINAL", "PROBE_BYTES", "Deflater", "Parts"]

COMPRESSOR = "zlib-ng" if _compressor is not zlib else "zlib"
"""Which library writes the deflate streams."""

PROBE_BYTES = 1 << 10
"""How much of a column of times or doubles is compressed to see whether the rest is worth it."""

Parts = list[tuple[bytes, bool]]
"""A section's payload in pieces, each flagged when it is a column of times or doubles."""

FINAL = b"\x01\x00\x00\xff\xff"
"""An empty final stored block (RFC 1951, 3.2.4): ends a section's stream after a full flush."""


class Deflater:
    """Each section's payload as a raw deflate stream, from one zlib compressor per level kept
    for a whole write: a section's pieces end at a full flush, which leaves no reference to what
    came before, and an empty final block ends its stream, so each section inflates alone.  A
    compressor's 256 KiB of state is set up once a write, not once a section and column group
    (~40 us each with cold caches; ~0.04 ms of a torch window's write).

    The runs of unflagged pieces are compressed together; a flagged piece of
    ``4 * PROBE_BYTES`` or more (a column of times or doubles) is compressed alone, and the rest
    of it stored as it is when its first ``PROBE_BYTES`` shrink by less than a tenth: a torch
    window's times hardly repeat, and zlib spent most of its time on them for a few percent,
    while a Python call workload's repeat and shrink threefold."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._packers: dict[int, Any] = {}

    def _piece(self, data: bytes, level: int) -> bytes:
        packer = self._packers.get(level)
        if packer is None:
            packer = self._packers[level] = _compressor.compressobj(
                level, _compressor.DEFLATED, -15
            )
        out: bytes = packer.compress(data) + packer.flush(_compressor.Z_FULL_FLUSH)
        return out

    def stream(self, parts: Parts) -> bytes:
        """The parts as one raw deflate stream."""
        out: list[bytes] = []
        run: list[bytes] = []
        for data, flagged in parts:
            if flagged and len(data) >= 4 * PROBE_BYTES:
                if run:
                    out.append(self._piece(b"".join(run), self.level))
                    run = []
                head = self._piece(data[:PROBE_BYTES], self.level)
                shrinks = len(head) * 10 <= PROBE_BYTES * 9
                out += (head, self._piece(data[PROBE_BYTES:], self.level if shrinks else 0))
            else:
                run.append(data)
        if run:
            out.append(self._piece(b"".join(run), self.level))
        out.append(FINAL)
        return b"".join(out)
