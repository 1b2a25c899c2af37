"""The protobuf wire bytes of Perfetto's per-event packets, encoded without a message object.

A ``.pftrace`` holds one ``TracePacket`` per slice begin, slice end, instant and counter point:
building each as a ``perfetto_trace_pb2`` message costs about as much as the rest of the
conversion together.  ``EventEncoder`` writes those packets' bytes directly; every field number
and wire type comes from the official definitions' descriptors (never typed in here), so the
bytes are what the messages would serialize to, up to field order.  Track descriptors and the
interned data (a few packets a trace) stay message objects.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stepscope.jsonenc import utf8
from stepscope.trace.compact_format import varint

__all__ = ["EventEncoder"]

_VARINT, _I64, _LEN = 0, 1, 2
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")


def _wire_type(field: Any) -> int:
    kind = field.type
    if kind in (field.TYPE_FIXED64, field.TYPE_DOUBLE, field.TYPE_SFIXED64):
        return _I64
    if kind in (field.TYPE_MESSAGE, field.TYPE_STRING, field.TYPE_BYTES):
        return _LEN
    if kind in (
        field.TYPE_UINT64,
        field.TYPE_UINT32,
        field.TYPE_INT64,
        field.TYPE_INT32,
        field.TYPE_ENUM,
        field.TYPE_BOOL,
    ):
        return _VARINT
    raise ValueError(f"{field.full_name}: a field type this encoder does not write")


def _keys(message: Any, *names: str) -> list[bytes]:
    """Each field's key (its number and wire type) from ``message``'s descriptor."""
    fields = message.DESCRIPTOR.fields_by_name
    return [varint(fields[n].number << 3 | _wire_type(fields[n])) for n in names]


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]
_HIGH_BITS = 35


def _uvarint(value: int) -> bytes:
    """``varint`` with the small values most fields hold made faster."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    return varint(value)


def _int(value: int) -> bytes:
    """An int64/uint64 varint (a negative int64 is its two's complement, ten bytes)."""
    return _uvarint(value if value >= 0 else value + (1 << 64))


def _length_delimited(key: bytes, body: bytes) -> bytes:
    return key + _uvarint(len(body)) + body


class _Times:
    """Varints of ns timestamps: the bits above the lowest 35 change about every 34 s, so
    their bytes are kept and only the five low groups are computed for each time."""

    def __init__(self) -> None:
        self._tails: dict[int, bytes] = {}

    def __call__(self, value: int) -> bytes:
        high = value >> _HIGH_BITS
        if high <= 0:
            if value < 0:
                raise ValueError(
                    f"an event at {value} ns before the epoch: Perfetto's timestamps are "
                    "unsigned, so this trace cannot be written as .pftrace"
                )
            return varint(value)
        tail = self._tails.get(high)
        if tail is None:
            tail = self._tails[high] = varint(high)
        return (
            bytes(
                (
                    value & 0x7F | 0x80,
                    value >> 7 & 0x7F | 0x80,
                    value >> 14 & 0x7F | 0x80,
                    value >> 21 & 0x7F | 0x80,
                    value >> 28 & 0x7F | 0x80,
                )
            )
            + tail
        )


class EventEncoder:
    """The wire bytes of ``TracePacket``s carrying one ``TrackEvent`` each."""

    def __init__(self, pb: Any, sequence_id: int) -> None:
        packet, event, ann = pb.TracePacket, pb.TrackEvent, pb.DebugAnnotation
        self._ts, seq, flags, self._event = _keys(
            packet, "timestamp", "trusted_packet_sequence_id", "sequence_flags", "track_event"
        )
        self._prefix = (
            seq + varint(sequence_id) + flags + varint(packet.SEQ_NEEDS_INCREMENTAL_STATE)
        )
        (
            type_key,
            self._track,
            self._name,
            self._category,
            self._flow,
            self._terminating,
            self._counter,
            self._annotation,
        ) = _keys(
            event,
            "type",
            "track_uuid",
            "name_iid",
            "category_iids",
            "flow_ids",
            "terminating_flow_ids",
            "double_counter_value",
            "debug_annotations",
        )
        self._kinds = {
            "begin": type_key + varint(event.TYPE_SLICE_BEGIN),
            "instant": type_key + varint(event.TYPE_INSTANT),
        }
        self._end = type_key + varint(event.TYPE_SLICE_END)
        self._counter_type = type_key + varint(event.TYPE_COUNTER)
        (
            self._a_name_iid,
            self._a_name,
            self._a_bool,
            self._a_uint,
            self._a_int,
            self._a_double,
            self._a_string,
            self._a_json,
            self._a_dict,
            self._a_array,
        ) = _keys(
            ann,
            "name_iid",
            "name",
            "bool_value",
            "uint_value",
            "int_value",
            "double_value",
            "string_value",
            "legacy_json_value",
            "dict_entries",
            "array_values",
        )
        self._time = _Times()
        self._tracks: dict[int, bytes] = {}
        self._names: dict[int, bytes] = {}
        self._categories: dict[int, bytes] = {}

    def packet(self, ts: int, event: bytes) -> bytes:
        """A whole ``TracePacket`` at ``ts`` (ns) around one ``TrackEvent`` body."""
        return b"".join(
            (self._ts, self._time(ts), self._prefix, self._event, _uvarint(len(event)), event)
        )

    def _track_of(self, uuid: int) -> bytes:
        found = self._tracks.get(uuid)
        if found is None:
            found = self._tracks[uuid] = self._track + varint(uuid)
        return found

    def end(self, track: int) -> bytes:
        """A slice end."""
        return self._end + self._track_of(track)

    def counter(self, track: int, value: float) -> bytes:
        """A counter point."""
        return self._counter_type + self._track_of(track) + self._counter + _DOUBLE.pack(value)

    def event(
        self,
        kind: str,
        track: int,
        name_iid: int,
        category_iid: int,
        flows: Iterable[int] = (),
        terminating: Iterable[int] = (),
        annotations: bytes = b"",
    ) -> bytes:
        """A slice begin (``kind`` ``"begin"``) or an instant event (``"instant"``) with its
        name, category (0: none), flow ids and debug annotations."""
        name = self._names.get(name_iid)
        if name is None:
            name = self._names[name_iid] = self._name + varint(name_iid)
        parts = [self._kinds[kind], self._track_of(track), name]
        if category_iid:
            category = self._categories.get(category_iid)
            if category is None:
                category = self._categories[category_iid] = self._category + varint(category_iid)
            parts.append(category)
        parts += [self._flow + _FIXED64.pack(fid) for fid in flows]
        parts += [self._terminating + _FIXED64.pack(fid) for fid in terminating]
        if annotations:
            parts.append(annotations)
        return b"".join(parts)

    def annotations(self, args: Mapping[str, Any], name_iid: Callable[[str], int]) -> bytes:
        """``args`` as repeated ``debug_annotations`` of a ``TrackEvent`` (names interned)."""
        key, name_key, value_of = self._annotation, self._a_name_iid, self._value
        parts: list[bytes] = []
        for name, value in args.items():
            body = name_key + _uvarint(name_iid(name)) + value_of(value)
            parts += (key, _uvarint(len(body)), body)
        return b"".join(parts)

    def _value(self, value: Any) -> bytes:
        """A ``DebugAnnotation``'s value fields from a JSON-like value, as the Chrome writer's
        JSON holds it (``stepscope.jsonenc``): ``None`` as JSON null, NaN and infinities as
        strings, an int beyond 64 bits as its JSON number, other types as their strings."""
        if isinstance(value, bool):
            return self._a_bool + (b"\x01" if value else b"\x00")
        if isinstance(value, int):
            if -(2**63) <= value < 2**63:
                return self._a_int + _int(value)
            if 0 <= value < 2**64:
                return self._a_uint + varint(value)
            return _length_delimited(self._a_json, str(value).encode())
        if isinstance(value, float):
            if math.isfinite(value):
                return self._a_double + _DOUBLE.pack(value)
            text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            return _length_delimited(self._a_string, text.encode())
        if isinstance(value, str):
            return _length_delimited(self._a_string, utf8(value))
        if value is None:
            return _length_delimited(self._a_json, b"null")
        if isinstance(value, Mapping):
            if not value:
                return _length_delimited(self._a_json, b"{}")
            return b"".join(
                _length_delimited(
                    self._a_dict,
                    _length_delimited(self._a_name, utf8(str(key))) + self._value(item),
                )
                for key, item in value.items()
            )
        if isinstance(value, (set, frozenset)):
            value = sorted(value, key=repr)
        if isinstance(value, (list, tuple)):
            if not value:
                return _length_delimited(self._a_json, b"[]")
            return b"".join(_length_delimited(self._a_array, self._value(v)) for v in value)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return _length_delimited(self._a_string, utf8(str(value)))
