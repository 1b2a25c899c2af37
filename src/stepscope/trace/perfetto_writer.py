"""Perfetto's own format: a ``Trace`` as ``TrackEvent`` protobuf packets (``.pftrace``).

Encoded with the official definitions (``perfetto_trace_pb2`` of the ``perfetto`` package, on
``protobuf``: the ``perfetto`` extra).  Event names and categories are interned once (one
packet sequence, its incremental state cleared by the first packet); each process and thread
is a track (``ProcessDescriptor`` / ``ThreadDescriptor``); spans are begin/end slice events,
and spans of one thread that overlap without nesting (asynchronous GPU work, say) go to child
tracks of the thread ("lanes"), since a track's slices must nest; each counter series is a
counter track; instants are instant events; a flow endpoint's id rides on the slice of its
thread that encloses it (``flow_ids``, ``terminating_flow_ids`` at the finish), or on an
instant event where none does.  A span's or instant's args are its debug annotations (names
interned; nested mappings and lists as dict entries and array values, ``None`` as JSON
``null``), as the Chrome file holds them.  Stack samples are written as the Chrome file shows
them in a timeline: their flame chart (``stepscope.trace.sampled_spans``), slices on a child
track of the sampled thread named ``samples: <thread>``.  Times are absolute ns.  Packets are
written one by one (``Trace.packet`` is a repeated field).
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from stepscope.atomic import atomic_output, ensure_parent
from stepscope.extras import require
from stepscope.trace.chrome_writer import WriteStats
from stepscope.trace.compact_format import varint
from stepscope.trace.layouts import LABEL_BASE
from stepscope.trace.model import Trace
from stepscope.trace.perfetto_wire import EventEncoder
from stepscope.trace.sampled_spans import (
    IDLE_FRAME,
    IDLE_NAME,
    SAMPLED_CATEGORY,
    sampled_flame_chart,
)

__all__ = ["PERFETTO_SUFFIX", "perfetto_packets", "write_perfetto_trace"]

PERFETTO_SUFFIX = ".pftrace"
_SEQUENCE = 1
_INT32 = 2**31


def _pb() -> Any:
    return require(
        "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        "writing Perfetto protobuf traces",
        "perfetto",
    )


class _Tracks:
    """Track uuids: one per process, per thread, per thread's lane and per counter series."""

    def __init__(self, pb: Any, trace: Trace) -> None:
        self.pb, self.trace = pb, trace
        self.uuids: dict[Any, int] = {}
        self.descriptors: list[Any] = []
        self.process_names = trace.process_names()
        self.thread_names = trace.thread_names()

    def _new(self, key: Any) -> tuple[int, Any]:
        uuid = len(self.uuids) + 1
        self.uuids[key] = uuid
        desc = self.pb.TrackDescriptor(uuid=uuid)
        self.descriptors.append(desc)
        return uuid, desc

    def process(self, pid: int) -> int:
        key = ("p", pid)
        if key in self.uuids:
            return self.uuids[key]
        uuid, desc = self._new(key)
        label = self.trace.label(pid)
        name = self.process_names.get(label, "")
        if isinstance(label, int) and -_INT32 <= label < _INT32:
            desc.process.pid = label
            if name:
                desc.process.process_name = name
        else:
            desc.name = str(label)  # Perfetto's pids are integers: the label names the track
        return uuid

    def thread(self, pid: int, tid: int) -> int:
        key = ("t", pid, tid)
        if key in self.uuids:
            return self.uuids[key]
        parent = self.process(pid)
        uuid, desc = self._new(key)
        p, t = self.trace.label(pid), self.trace.label(tid)
        name = self.thread_names.get((p, t), "")
        desc.parent_uuid = parent
        if all(isinstance(v, int) and -_INT32 <= v < _INT32 for v in (p, t)):
            desc.thread.pid, desc.thread.tid = p, t
            if name:
                desc.thread.thread_name = name
        else:
            desc.name = str(t)
        return uuid

    def lane(self, pid: int, tid: int, lane: int) -> int:
        if lane == 0:
            return self.thread(pid, tid)
        key = ("l", pid, tid, lane)
        if key in self.uuids:
            return self.uuids[key]
        parent = self.thread(pid, tid)
        uuid, desc = self._new(key)
        desc.parent_uuid = parent
        desc.name = (
            f"{self.thread_names.get((self.trace.label(pid), self.trace.label(tid)), tid)} ({lane})"
        )
        return uuid

    def sampled(self, pid: int, tid: int, name: str) -> int:
        """The flame-chart track of a sampled thread (``tid``: its column value), a child of
        the thread's track."""
        key = ("s", pid, tid)
        if key in self.uuids:
            return self.uuids[key]
        parent = self.thread(pid, tid)
        uuid, desc = self._new(key)
        desc.parent_uuid = parent
        desc.name = name
        return uuid

    def counter(self, pid: int, name: str) -> int:
        key = ("c", pid, name)
        if key in self.uuids:
            return self.uuids[key]
        parent = self.process(pid)
        uuid, desc = self._new(key)
        desc.parent_uuid = parent
        desc.name = name
        desc.counter.SetInParent()
        return uuid


def _lanes(starts: Any, durs: Any, rows: list[int]) -> list[tuple[int, list[int]]]:
    """Spans of one thread (rows sorted by start, longest first) split into lanes in which they
    nest; each lane's rows in begin order."""
    lanes: list[tuple[list[int], list[int]]] = []  # (open ends stack, rows)
    for row in rows:
        start, end = starts[row], starts[row] + durs[row]
        for stack, placed in lanes:
            while stack and stack[-1] <= start and end > stack[-1]:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                placed.append(row)
                break
        else:
            lanes.append(([end], [row]))
    return list(enumerate(placed for _, placed in lanes))


def _slice_events(starts: Any, durs: Any, rows: list[int]) -> Iterator[tuple[int, int, int]]:
    """(time, row, +1 begin / -1 end) of nesting rows in begin order, ends before later begins."""
    open_rows: list[int] = []
    for row in rows:
        start, end = starts[row], starts[row] + durs[row]
        while open_rows:
            top = open_rows[-1]
            top_end = starts[top] + durs[top]
            if end <= top_end:
                break
            yield top_end, top, -1
            open_rows.pop()
        yield start, row, 1
        open_rows.append(row)
    while open_rows:
        top = open_rows.pop()
        yield starts[top] + durs[top], top, -1


def perfetto_packets(trace: Trace) -> Iterator[bytes]:
    """The serialized ``TracePacket`` messages of ``trace``, in order."""
    pb = _pb()
    wire = EventEncoder(pb, _SEQUENCE)
    base = trace.base_time_ns
    tracks = _Tracks(pb, trace)
    # interned by the trace's string id, or by the text for one that is not the trace's
    names: dict[int | str, int] = {}
    cats: dict[int | str, int] = {}
    arg_names: dict[str, int] = {}

    def name_iid(sid: int | str) -> int:
        return names.setdefault(sid, len(names) + 1)

    def cat_iid(sid: int | str) -> int:
        return cats.setdefault(sid, len(cats) + 1) if sid else 0

    def arg_iid(key: str) -> int:
        return arg_names.setdefault(key, len(arg_names) + 1)

    def annotations(ref: int) -> bytes:
        """The args of ``ref`` as debug annotations (none for none or empty ones)."""
        return wire.annotations(trace.args[ref], arg_iid) if ref >= 0 else b""

    spans = trace.spans
    s_name, s_cat, s_pid, s_tid = spans["name"], spans["cat"], spans["pid"], spans["tid"]
    s_args = spans["args"]
    starts, durs = spans["start_ns"], spans["dur_ns"]
    by_thread: dict[tuple[int, int], list[int]] = defaultdict(list)
    for row, key in enumerate(zip(s_pid, s_tid, strict=True)):
        by_thread[key].append(row)
    events: list[tuple[int, bytes]] = []  # (time, TrackEvent), interning filled as they are made
    flow_marks: dict[int, tuple[list[int], list[int]]] = {}  # span row -> (flow ids, finishing)
    thread_rows: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
    lanes_of: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for key, rows in by_thread.items():
        rows.sort(key=lambda r: (starts[r], -durs[r], r))
        lanes_of[key] = _lanes(starts, durs, rows)
        thread_rows[key] = (rows, [starts[r] for r in rows], [starts[r] + durs[r] for r in rows])

    flows = trace.flows
    loose_flows: list[tuple[int, int, int, int, int, bool]] = []
    for name, pid, tid, ts, fid, phase in zip(
        flows["name"],
        flows["pid"],
        flows["tid"],
        flows["ts_ns"],
        flows["flow_id"],
        flows["phase"],
        strict=True,
    ):
        finishing = phase == ord("f")
        host = _enclosing(thread_rows.get((pid, tid)), ts)
        if host is None:
            loose_flows.append((name, pid, tid, ts, fid, finishing))
        else:
            flow_marks.setdefault(host, ([], []))[1 if finishing else 0].append(fid)

    no_marks: tuple[list[int], list[int]] = ([], [])

    def span_begin(track: int, row: int) -> bytes:
        marks = flow_marks.get(row, no_marks)
        return wire.event(
            "begin",
            track,
            name_iid(s_name[row]),
            cat_iid(s_cat[row]),
            marks[0],
            marks[1],
            annotations(s_args[row]),
        )

    for (pid, tid), lanes in lanes_of.items():
        for lane, rows in lanes:
            track = tracks.lane(pid, tid, lane)
            events += _track_events(wire, track, base, starts, durs, rows, span_begin)

    for name, pid, tid, ts, fid, finishing in loose_flows:
        flow_ids: tuple[list[int], list[int]] = ([], [fid]) if finishing else ([fid], [])
        event = wire.event("instant", tracks.thread(pid, tid), name_iid(name), 0, *flow_ids)
        events.append((base + ts, event))

    inst = trace.instants
    for name, cat, pid, tid, ts, scope, ref in zip(
        inst["name"],
        inst["cat"],
        inst["pid"],
        inst["tid"],
        inst["ts_ns"],
        inst["scope"],
        inst["args"],
        strict=True,
    ):
        track = tracks.thread(pid, tid) if scope == ord("t") else tracks.process(pid)
        event = wire.event(
            "instant", track, name_iid(name), cat_iid(cat), annotations=annotations(ref)
        )
        events.append((base + ts, event))

    events += _sampled_events(wire, trace, tracks, name_iid, cat_iid)

    counters = trace.counters
    for name, pid, ts, series, value in zip(
        counters["name"],
        counters["pid"],
        counters["ts_ns"],
        counters["series"],
        counters["value"],
        strict=True,
    ):
        label = trace.strings[name]
        if trace.strings[series] != label:
            label = f"{label}.{trace.strings[series]}"
        events.append((base + ts, wire.counter(tracks.counter(pid, label), value)))

    first = pb.TracePacket(trusted_packet_sequence_id=_SEQUENCE)
    first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    interned = first.interned_data
    for sid, iid in names.items():
        interned.event_names.add(iid=iid, name=_text(trace, sid))
    for sid, iid in cats.items():
        interned.event_categories.add(iid=iid, name=_text(trace, sid))
    for arg_name, iid in arg_names.items():
        interned.debug_annotation_names.add(iid=iid, name=arg_name)
    yield first.SerializeToString()
    for desc in tracks.descriptors:
        yield pb.TracePacket(track_descriptor=desc).SerializeToString()
    events.sort(key=lambda item: item[0])
    packet = wire.packet
    for ts, event in events:
        yield packet(ts, event)


def _sampled_events(
    wire: EventEncoder,
    trace: Trace,
    tracks: _Tracks,
    name_iid: Callable[[int | str], int],
    cat_iid: Callable[[int | str], int],
) -> list[tuple[int, bytes]]:
    """The stack samples' flame chart as slice events on each sampled thread's child track."""
    spans, sampled = sampled_flame_chart(trace)
    if not spans:
        return []
    uuids: dict[tuple[int, int | str], int] = {}
    for t in sampled:
        tid = t.tid if isinstance(t.tid, int) else LABEL_BASE + trace.strings.index(t.tid)
        uuids[(t.pid, t.track)] = tracks.sampled(t.pid, tid, t.name)
    category = cat_iid(SAMPLED_CATEGORY)
    events: list[tuple[int, bytes]] = []
    by_track: dict[int, list[int]] = defaultdict(list)
    for i, span in enumerate(spans):
        by_track[uuids[(span.pid, span.track)]].append(i)
    starts = [s.start_ns for s in spans]
    durs = [s.dur_ns for s in spans]

    def frame_begin(track: int, row: int) -> bytes:
        name = spans[row].name
        return wire.event(
            "begin", track, name_iid(IDLE_FRAME if name == IDLE_NAME else name), category
        )

    for track, rows in by_track.items():
        rows.sort(key=lambda r: (starts[r], -durs[r], r))
        events += _track_events(wire, track, trace.base_time_ns, starts, durs, rows, frame_begin)
    return events


def _track_events(
    wire: EventEncoder,
    track: int,
    base: int,
    starts: Any,
    durs: Any,
    rows: list[int],
    begin: Callable[[int, int], bytes],
) -> Iterator[tuple[int, bytes]]:
    """One track's nesting rows as (time, TrackEvent): ``begin(track, row)``'s event at each
    begin, a slice end at each end."""
    end = wire.end(track)
    for ts, row, kind in _slice_events(starts, durs, rows):
        yield base + ts, begin(track, row) if kind > 0 else end


def _text(trace: Trace, sid: int | str) -> str:
    return trace.strings[sid] if isinstance(sid, int) else sid


def _enclosing(rows: tuple[list[int], list[int], list[int]] | None, ts: int) -> int | None:
    """The innermost span (row) of a thread whose time holds ``ts``, if any."""
    if rows is None:
        return None
    order, begins, ends = rows
    best = None
    i = bisect.bisect_right(begins, ts) - 1
    while i >= 0:
        if ends[i] >= ts:
            best = order[i]
            break
        i -= 1
    return best


def write_perfetto_trace(trace: Trace, path: str | os.PathLike[str]) -> WriteStats:
    """Write ``trace`` as a Perfetto protobuf trace (``.pftrace``), atomically."""
    target = ensure_parent(path, "trace")
    written = packets = 0
    with atomic_output(target, what="trace") as fh:
        for packet in perfetto_packets(trace):
            chunk = b"\x0a" + varint(len(packet)) + packet
            fh.write(chunk)
            written += len(chunk)
            packets += 1
    return WriteStats(str(target), packets, written)
