"""Columns as LEB128 varints for the compact trace form: zigzag for signed or delta-coded ones.

``pack_column`` and ``unpack_column`` use the C ``pack_varints`` / ``unpack_varints``
(``_csrc/compact_columns.c``) when the extension is built; ``pack_python`` and ``unpack_python``
are their twins and give the same bytes.  A truncated or malformed stream is a ``ValueError``.
"""

from __future__ import annotations

from array import array
from typing import Any

from stepscope._ext import native

__all__ = [
    "pack_column",
    "pack_python",
    "unpack_column",
    "unpack_python",
]

_MASK = (1 << 64) - 1
_BOUNDS = {
    "B": (0, 0xFF),
    "I": (0, 0xFFFFFFFF),
    "i": (-(2**31), 2**31 - 1),
    "q": (-(2**63), 2**63 - 1),
}
_BAD = "column data truncated or malformed"


def _wrap(v: int) -> int:
    """``v`` as a signed 64-bit integer (deltas wrap as in C)."""
    v &= _MASK
    return v - (1 << 64) if v >> 63 else v


def pack_python(
    values: Any, typecode: str, delta: bool, floor: int = -(2**63), empty: Any = None
) -> bytes:
    """Twin of the C ``pack_varints``: the values (those below ``floor``, and those that index a
    zero of ``empty``, as ``floor``) as (zigzag, delta-coded) varints."""
    if typecode not in _BOUNDS or (empty is not None and memoryview(empty).nbytes % 8):
        raise ValueError("pack_varints: bad typecode or column length")
    zigzag = delta or typecode in "iq"
    out = bytearray()
    prev = 0
    zeros = array("q", bytes(memoryview(empty))) if empty is not None else array("q")
    for v in values:
        if v < floor or (0 <= v < len(zeros) and not zeros[v]):
            v = floor
        if delta:
            v, prev = _wrap(v - prev), v
        u = ((v << 1) ^ (v >> 63)) & _MASK if zigzag else v
        while u >= 0x80:
            out.append((u & 0x7F) | 0x80)
            u >>= 7
        out.append(u)
    return bytes(out)


def unpack_python(
    data: bytes | memoryview, offset: int, count: int, typecode: str, delta: bool
) -> tuple[bytes, int]:
    """Twin of the C ``unpack_varints``: ``count`` values from ``offset``, and the end offset."""
    if typecode not in _BOUNDS or offset < 0 or count < 0 or count > len(data) - offset:
        raise ValueError(_BAD)
    lo, hi = _BOUNDS[typecode]
    zigzag = delta or typecode in "iq"
    out = array(typecode)
    prev, at, end = 0, offset, len(data)
    for _ in range(count):
        u, shift = 0, 0
        while True:
            if at >= end or shift > 63:
                raise ValueError(_BAD)
            b = data[at]
            at += 1
            u |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        u &= _MASK
        v = (u >> 1) ^ -(u & 1) if zigzag else _wrap(u) if typecode == "q" else u
        if delta:
            v = prev = _wrap(prev + v)
        if not lo <= v <= hi:
            raise ValueError("column value out of range")
        out.append(v)
    return out.tobytes(), at


def pack_column(
    values: Any, typecode: str, delta: bool, floor: int = -(2**63), empty: Any = None
) -> bytes:
    """A column (array or memoryview of ``typecode`` B, I, i or q) as varints, values below
    ``floor`` written as ``floor``; so are those that index a zero of ``empty`` (an int64
    column: an args ref to an empty mapping is no args)."""
    mod = native()
    if mod is None:
        return pack_python(values, typecode, delta, floor, empty)
    if empty is None:
        return mod.pack_varints(values, typecode, delta, floor)
    return mod.pack_varints(values, typecode, delta, floor, empty)


def unpack_column(
    data: bytes | memoryview, offset: int, count: int, typecode: str, delta: bool
) -> tuple[bytes, int]:
    """``count`` varints from ``offset`` as the column's bytes, and the offset after them."""
    mod = native()
    if mod is None:
        return unpack_python(data, offset, count, typecode, delta)
    return mod.unpack_varints(data, offset, count, typecode, delta)
