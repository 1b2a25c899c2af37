"""The interchange model: a read-only ``Trace`` of columnar event tables, built by ``TraceBuilder``.

Times are integer nanoseconds relative to ``Trace.base_time_ns`` (Unix ns of time zero).  Traces
recorded by stepscope use the process's monotonic clock as event time and ``clock.wall_base_ns()``
as the base; traces read from files keep the file's base.  Names and categories are interned in
one string table per trace; id 0 is the empty string, which also stands for "absent".

pid and tid columns hold integers; a foreign trace's string pid/tid (Kineto writes ``"Spans"``,
``""``) is stored as ``LABEL_BASE + string id`` and written back as the string.
"""

from __future__ import annotations

from array import array
from collections.abc import Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from stepscope.trace.layouts import (
    COUNTER_COLUMNS,
    FLOW_COLUMNS,
    INSTANT_COLUMNS,
    LABEL_BASE,
    META_COLUMNS,
    SAMPLE_COLUMNS,
    SCHEMA_VERSION,
    SPAN_COLUMNS,
    TABLE_LAYOUTS,
)
from stepscope.trace.remap import IDS, LABELS, REFS, TIMES, remapped


class Span(NamedTuple):
    """One complete span, decoded."""

    name: str
    cat: str
    pid: int | str
    tid: int | str
    start_ns: int
    dur_ns: int
    args: Mapping[str, Any] | None

    @property
    def end_ns(self) -> int:
        """End time (ns)."""
        return self.start_ns + self.dur_ns


class Instant(NamedTuple):
    """One instant event, decoded."""

    name: str
    cat: str
    pid: int | str
    tid: int | str
    ts_ns: int
    scope: str
    args: Mapping[str, Any] | None


class CounterEvent(NamedTuple):
    """One counter event (several series at one time), decoded."""

    name: str
    pid: int | str
    tid: int | str
    ts_ns: int
    values: dict[str, float]


class Flow(NamedTuple):
    """One flow endpoint, decoded."""

    name: str
    cat: str
    pid: int | str
    tid: int | str
    ts_ns: int
    flow_id: int
    phase: str
    binding: str


class MetaEvent(NamedTuple):
    """One metadata (``M``) event, decoded."""

    name: str
    pid: int | str
    tid: int | str
    args: Mapping[str, Any] | None


class Sample(NamedTuple):
    """One stack sample, decoded (stack is root-first)."""

    pid: int | str
    tid: int | str
    ts_ns: int
    stack: tuple[str, ...]
    weight: int
    idle: bool


class Table:
    """A read-only set of equal-length columns."""

    __slots__ = ("_columns", "_length", "layout")

    def __init__(self, layout: tuple[tuple[str, str], ...], columns: Mapping[str, array[Any]]):
        self.layout = layout
        self._columns: dict[str, memoryview] = {
            name: memoryview(columns[name]).toreadonly() for name, _ in layout
        }
        lengths = {len(col) for col in self._columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of unequal length: {sorted(lengths)}")
        self._length = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, column: str) -> memoryview:
        try:
            return self._columns[column]
        except KeyError:
            names = ", ".join(name for name, _ in self.layout)
            raise KeyError(f"no column {column!r}; columns are: {names}") from None

    def column_names(self) -> list[str]:
        """The column names in layout order."""
        return [name for name, _ in self.layout]


@dataclass(frozen=True)
class Trace:
    """Trace metadata plus columnar event tables; read-only (build one with ``TraceBuilder``)."""

    strings: tuple[str, ...]
    tables: Mapping[str, Table]
    args: tuple[Mapping[str, Any], ...]
    base_time_ns: int
    metadata: Mapping[str, Any]
    device_properties: tuple[Mapping[str, Any], ...] = ()
    distributed_info: Mapping[str, Any] | None = None
    trace_name: str | None = None
    display_time_unit: str = "ms"
    schema_version: int = SCHEMA_VERSION

    @property
    def spans(self) -> Table:
        """Complete spans (Chrome ``X`` events)."""
        return self.tables["spans"]

    @property
    def instants(self) -> Table:
        """Instant events (``i``)."""
        return self.tables["instants"]

    @property
    def counters(self) -> Table:
        """Counter rows (``C`` events, one row per series)."""
        return self.tables["counters"]

    @property
    def flows(self) -> Table:
        """Flow endpoints (``s``/``t``/``f``)."""
        return self.tables["flows"]

    @property
    def meta(self) -> Table:
        """Metadata events (``M``): process and thread names, labels, sort indices."""
        return self.tables["meta"]

    @property
    def samples(self) -> Table:
        """Stack samples."""
        return self.tables["samples"]

    def string(self, string_id: int) -> str:
        """The interned string with this id."""
        return self.strings[string_id]

    def label(self, value: int) -> int | str:
        """Decode a pid/tid column value (an int, or a string label from a foreign trace)."""
        if value >= LABEL_BASE:
            return self.strings[value - LABEL_BASE]
        return value

    def args_at(self, ref: int) -> Mapping[str, Any] | None:
        """The args mapping for an ``args`` column value (None for -1)."""
        if ref >= 0:
            return self.args[ref]
        if ref == -1:
            return None
        ids = self.tables["python_ids"]
        parent = ids["parent"][-2 - ref]
        return {"Python id": ids["id"][-2 - ref], "Python parent id": parent or None}

    def iter_spans(self) -> Iterator[Span]:
        """Decode spans one by one (for analysis; exporters read the columns directly)."""
        t = self.spans
        s, label, args_at = self.strings, self.label, self.args_at
        cols = [t[name] for name, _ in SPAN_COLUMNS]
        for name, cat, pid, tid, start, dur, args in zip(*cols, strict=True):
            yield Span(s[name], s[cat], label(pid), label(tid), start, dur, args_at(args))

    def iter_instants(self) -> Iterator[Instant]:
        """Decode instant events."""
        t = self.instants
        s, label, args_at = self.strings, self.label, self.args_at
        cols = [t[name] for name, _ in INSTANT_COLUMNS]
        for name, cat, pid, tid, ts, scope, args in zip(*cols, strict=True):
            yield Instant(s[name], s[cat], label(pid), label(tid), ts, chr(scope), args_at(args))

    def iter_counter_events(self) -> Iterator[CounterEvent]:
        """Decode counter events, grouping the rows of each event."""
        t = self.counters
        s, label = self.strings, self.label
        current: CounterEvent | None = None
        cols = [t[name] for name, _ in COUNTER_COLUMNS]
        for name, pid, tid, ts, series, value, first in zip(*cols, strict=True):
            if first or current is None:
                if current is not None:
                    yield current
                current = CounterEvent(s[name], label(pid), label(tid), ts, {})
            current.values[s[series]] = value
        if current is not None:
            yield current

    def counter_event_count(self) -> int:
        """Number of counter events (not rows)."""
        firsts = self.counters["first"]
        return sum(1 for i, f in enumerate(firsts) if f or i == 0)

    def iter_flows(self) -> Iterator[Flow]:
        """Decode flow endpoints."""
        t = self.flows
        s, label = self.strings, self.label
        cols = [t[name] for name, _ in FLOW_COLUMNS]
        for name, cat, pid, tid, ts, fid, phase, binding in zip(*cols, strict=True):
            bind = chr(binding) if binding else ""
            yield Flow(s[name], s[cat], label(pid), label(tid), ts, fid, chr(phase), bind)

    def iter_meta(self) -> Iterator[MetaEvent]:
        """Decode metadata events."""
        t = self.meta
        s, label, args_at = self.strings, self.label, self.args_at
        cols = [t[name] for name, _ in META_COLUMNS]
        for name, pid, tid, args in zip(*cols, strict=True):
            yield MetaEvent(s[name], label(pid), label(tid), args_at(args))

    def stack_frame_ids(self, stack_id: int) -> list[int]:
        """The frame ids (rows of ``tables["frames"]``) of an interned stack, root first."""
        stacks = self.tables["stacks"]
        parents, frame_of = stacks["parent"], stacks["frame"]
        ids: list[int] = []
        while stack_id >= 0:
            ids.append(frame_of[stack_id])
            stack_id = parents[stack_id]
        ids.reverse()
        return ids

    def stack_frames(self, stack_id: int) -> tuple[str, ...]:
        """The frame names of an interned stack, root first."""
        names = self.tables["frames"]["name"]
        return tuple(self.strings[names[fid]] for fid in self.stack_frame_ids(stack_id))

    def iter_samples(self) -> Iterator[Sample]:
        """Decode samples with their stacks."""
        t = self.samples
        label = self.label
        cols = [t[name] for name, _ in SAMPLE_COLUMNS]
        for pid, tid, ts, stack, weight, idle in zip(*cols, strict=True):
            yield Sample(label(pid), label(tid), ts, self.stack_frames(stack), weight, bool(idle))

    def process_names(self) -> dict[int | str, str]:
        """pid -> process name, from the metadata events."""
        return {
            m.pid: str(m.args.get("name", ""))
            for m in self.iter_meta()
            if m.name == "process_name" and m.args is not None
        }

    def thread_names(self) -> dict[tuple[int | str, int | str], str]:
        """(pid, tid) -> thread name, from the metadata events."""
        return {
            (m.pid, m.tid): str(m.args.get("name", ""))
            for m in self.iter_meta()
            if m.name == "thread_name" and m.args is not None
        }

    def event_count(self) -> int:
        """Number of events in the tables, as ``traceEvents`` (samples excluded: the writer puts
        them in ``samples``, plus a flame chart it derives from them)."""
        return (
            len(self.spans)
            + len(self.instants)
            + self.counter_event_count()
            + len(self.flows)
            + len(self.meta)
        )

    def __repr__(self) -> str:
        return (
            f"Trace(spans={len(self.spans)}, instants={len(self.instants)}, "
            f"counter_rows={len(self.counters)}, flows={len(self.flows)}, meta={len(self.meta)}, "
            f"samples={len(self.samples)}, name={self.trace_name!r})"
        )


_REMAP_MODES = {
    "name": IDS,
    "cat": IDS,
    "series": IDS,
    "pid": LABELS,
    "tid": LABELS,
    "start_ns": TIMES,
    "ts_ns": TIMES,
    "args": REFS,
}


def _extend(column: array[Any], values: Any) -> None:
    """Append to a column: a column's memoryview as bytes at once, anything else by items."""
    if type(values) is memoryview:
        column.frombytes(values.cast("B"))
    else:
        column.extend(values)


class TraceBuilder:
    """Appends events cheaply into columns; ``build()`` returns the read-only ``Trace``."""

    def __init__(self, base_time_ns: int | None = None) -> None:
        if base_time_ns is None:
            from stepscope.clock import wall_base_ns

            base_time_ns = wall_base_ns()
        self.base_time_ns = base_time_ns
        self._strings: list[str] = [""]
        self._string_ids: dict[str, int] = {"": 0}
        self._args: list[Mapping[str, Any]] = []
        self._cols: dict[str, dict[str, array[Any]]] = {
            table: {name: array(code) for name, code in layout}
            for table, layout in TABLE_LAYOUTS.items()
        }
        self._frame_ids: dict[tuple[int, int, int], int] = {}
        self._noted_tracks: list[tuple[int, int, set[tuple[int, int]]]] = []
        self._stack_ids: dict[tuple[int, int], int] = {}
        self.metadata: dict[str, Any] = {}
        self.device_properties: list[Mapping[str, Any]] = []
        self.distributed_info: Mapping[str, Any] | None = None
        self.trace_name: str | None = None
        self.display_time_unit = "ms"
        # Bound appenders for the hot paths.
        spans = self._cols["spans"]
        self._span_append = tuple(spans[name].append for name, _ in SPAN_COLUMNS)

    # -- interning ---------------------------------------------------------------------------
    def intern(self, text: str) -> int:
        """Id of ``text`` in this trace's string table (added if new)."""
        sid = self._string_ids.get(text)
        if sid is None:
            if not isinstance(text, str):
                raise TypeError(f"trace strings must be str, got {type(text).__name__}: {text!r}")
            sid = len(self._strings)
            self._strings.append(text)
            self._string_ids[text] = sid
        return sid

    def encode_label(self, value: int | str) -> int:
        """Encode a pid/tid (int, or string label) for a column."""
        if isinstance(value, str):
            return LABEL_BASE + self.intern(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pid/tid must be int or str, got {type(value).__name__}: {value!r}")
        if not -LABEL_BASE <= value < LABEL_BASE:
            raise ValueError(f"pid/tid {value} is out of range (|value| < 2**62)")
        return value

    def _add_args(self, args: Mapping[str, Any] | None) -> int:
        if args is None:
            return -1
        if not isinstance(args, Mapping):
            raise TypeError(f"args must be a mapping or None, got {type(args).__name__}")
        self._args.append(args)
        return len(self._args) - 1

    # -- events ------------------------------------------------------------------------------
    def span(
        self,
        name: str,
        cat: str,
        pid: int | str,
        tid: int | str,
        start_ns: int,
        dur_ns: int,
        args: Mapping[str, Any] | None = None,
    ) -> None:
        """Append a complete span."""
        a_name, a_cat, a_pid, a_tid, a_start, a_dur, a_args = self._span_append
        a_name(self.intern(name))
        a_cat(self.intern(cat))
        a_pid(self.encode_label(pid))
        a_tid(self.encode_label(tid))
        a_start(start_ns)
        a_dur(dur_ns)
        a_args(self._add_args(args))

    def extend_spans(
        self,
        name_ids: Sequence[int],
        cat_ids: Sequence[int],
        pids: Sequence[int],
        tids: Sequence[int],
        starts: Sequence[int],
        durs: Sequence[int],
        args_refs: Sequence[int] | None = None,
    ) -> None:
        """Append many spans at once from already-interned ids (for collectors with bulk data)."""
        n = len(name_ids)
        parts = (cat_ids, pids, tids, starts, durs) + (
            (args_refs,) if args_refs is not None else ()
        )
        if any(len(p) != n for p in parts):
            raise ValueError("extend_spans: all columns must have the same length")
        cols = self._cols["spans"]
        cols["name"].extend(name_ids)
        cols["cat"].extend(cat_ids)
        cols["pid"].extend(pids)
        cols["tid"].extend(tids)
        cols["start_ns"].extend(starts)
        cols["dur_ns"].extend(durs)
        if args_refs is None:
            cols["args"].extend(array("i", [-1]) * n)
        else:
            cols["args"].extend(args_refs)

    def bulk_tables(self) -> tuple[dict[str, int], list[str], list[Any]]:
        """The live string ids, strings and args store, for bulk readers that append in place."""
        return self._string_ids, self._strings, self._args

    def extend_table_bytes(self, table: str, columns: Sequence[bytes]) -> None:
        """Append rows to a table from the machine-order bytes of its columns (interned ids)."""
        cols = self._cols[table]
        staged = []
        for (name, code), data in zip(TABLE_LAYOUTS[table], columns, strict=True):
            column = array(code)
            column.frombytes(data)
            staged.append((cols[name], column))
        if len({len(column) for _, column in staged}) > 1:
            raise ValueError(f"extend_table_bytes: the {table} columns differ in length")
        for dst, column in staged:
            dst.extend(column)

    def column(self, table: str, column: str) -> array[Any]:
        """One column of a table's rows appended so far (``spans``, ``instants``...): read it or
        change values in place; append through ``span``, ``instant``..."""
        return self._cols[table][column]

    def row_args(self, table: str, row: int) -> Mapping[str, Any] | None:
        """The args of an appended row of ``table``."""
        ref = self._cols[table]["args"][row]
        return self._args[ref] if ref >= 0 else None

    def set_row_args(self, table: str, row: int, args: Mapping[str, Any]) -> None:
        """Replace the args of an appended row (a collector adding what another one knows)."""
        self._cols[table]["args"][row] = self._add_args(args)

    def add_args(self, args: Mapping[str, Any]) -> int:
        """Store an args mapping and return its ref (for ``extend_spans``)."""
        return self._add_args(args)

    @property
    def python_ids_rows(self) -> int:
        """Rows in the ``python_ids`` table so far (the next row's index)."""
        return len(self._cols["python_ids"]["id"])

    @contextmanager
    def grown(
        self, table: str, n: int, fill: Mapping[str, int] | None = None
    ) -> Iterator[dict[str, memoryview]]:
        """Add ``n`` rows to ``table`` (0, or ``fill``'s value per column) and lend writable
        views of them, for bulk writers that fill columns in place (released on exit)."""
        views: dict[str, memoryview] = {}
        zeros = memoryview(bytes(8 * n))  # one source for every column: its pages read once
        try:
            for name, col in self._cols[table].items():
                start = len(col)
                if fill and name in fill:
                    col.extend(array(col.typecode, [fill[name]]) * n)
                else:
                    col.frombytes(zeros[: n * col.itemsize])
                with memoryview(col) as whole:
                    views[name] = whole[start:]
            yield views
        finally:
            for view in views.values():
                view.release()

    def instant(
        self,
        name: str,
        cat: str,
        pid: int | str,
        tid: int | str,
        ts_ns: int,
        scope: str = "t",
        args: Mapping[str, Any] | None = None,
    ) -> None:
        """Append an instant event (scope ``t`` thread, ``p`` process, ``g`` global)."""
        if scope not in ("t", "p", "g"):
            raise ValueError(f"instant scope must be 't', 'p' or 'g', got {scope!r}")
        c = self._cols["instants"]
        c["name"].append(self.intern(name))
        c["cat"].append(self.intern(cat))
        c["pid"].append(self.encode_label(pid))
        c["tid"].append(self.encode_label(tid))
        c["ts_ns"].append(ts_ns)
        c["scope"].append(ord(scope))
        c["args"].append(self._add_args(args))

    def counter(
        self,
        name: str,
        pid: int | str,
        ts_ns: int,
        values: Mapping[str, float],
        tid: int | str = 0,
    ) -> None:
        """Append a counter event: one or more named series at one time."""
        if not values:
            raise ValueError(f"counter {name!r} needs at least one series value")
        c = self._cols["counters"]
        name_id, p, t = self.intern(name), self.encode_label(pid), self.encode_label(tid)
        first = 1
        for series, value in values.items():
            c["name"].append(name_id)
            c["pid"].append(p)
            c["tid"].append(t)
            c["ts_ns"].append(ts_ns)
            c["series"].append(self.intern(series))
            c["value"].append(float(value))
            c["first"].append(first)
            first = 0

    def counter_series(
        self, name: str, pid: int | str, series: str, points: Sequence[tuple[int, float]]
    ) -> None:
        """Append one series' points ``(ts_ns, value)`` as counter events, in one go."""
        c = self._cols["counters"]
        n = len(points)
        c["name"].extend([self.intern(name)] * n)
        c["pid"].extend([self.encode_label(pid)] * n)
        c["tid"].extend([0] * n)
        c["ts_ns"].extend([ts for ts, _ in points])
        c["series"].extend([self.intern(series)] * n)
        c["value"].extend([float(value) for _, value in points])
        c["first"].extend([1] * n)

    def flow(
        self,
        name: str,
        cat: str,
        pid: int | str,
        tid: int | str,
        ts_ns: int,
        flow_id: int,
        phase: str,
        binding: str = "",
    ) -> None:
        """Append a flow endpoint (``s`` start, ``t`` step, ``f`` finish; binding ``e`` or '')."""
        if phase not in ("s", "t", "f"):
            raise ValueError(f"flow phase must be 's', 't' or 'f', got {phase!r}")
        if binding not in ("", "e"):
            raise ValueError(f"flow binding must be '' or 'e', got {binding!r}")
        c = self._cols["flows"]
        c["name"].append(self.intern(name))
        c["cat"].append(self.intern(cat))
        c["pid"].append(self.encode_label(pid))
        c["tid"].append(self.encode_label(tid))
        c["ts_ns"].append(ts_ns)
        c["flow_id"].append(flow_id)
        c["phase"].append(ord(phase))
        c["binding"].append(ord(binding) if binding else 0)

    def meta_event(
        self, name: str, pid: int | str, tid: int | str, args: Mapping[str, Any]
    ) -> None:
        """Append a metadata (``M``) event such as ``process_name``."""
        c = self._cols["meta"]
        c["name"].append(self.intern(name))
        c["pid"].append(self.encode_label(pid))
        c["tid"].append(self.encode_label(tid))
        c["args"].append(self._add_args(args))

    def process_name(self, pid: int | str, name: str) -> None:
        """Name a process track."""
        self.meta_event("process_name", pid, 0, {"name": name})

    def thread_name(self, pid: int | str, tid: int | str, name: str) -> None:
        """Name a thread track."""
        self.meta_event("thread_name", pid, tid, {"name": name})

    def frame(self, name: str, file: str = "", line: int = 0) -> int:
        """Intern a stack frame; returns its id."""
        key = (self.intern(name), self.intern(file), line)
        fid = self._frame_ids.get(key)
        if fid is None:
            c = self._cols["frames"]
            fid = len(c["name"])
            c["name"].append(key[0])
            c["file"].append(key[1])
            c["line"].append(line)
            self._frame_ids[key] = fid
        return fid

    def stack(self, frame_ids: Sequence[int]) -> int:
        """Intern a stack given root-first frame ids; returns its id (-1 if empty)."""
        parent = -1
        c = self._cols["stacks"]
        for fid in frame_ids:
            key = (parent, fid)
            sid = self._stack_ids.get(key)
            if sid is None:
                sid = len(c["parent"])
                c["parent"].append(parent)
                c["frame"].append(fid)
                self._stack_ids[key] = sid
            parent = sid
        return parent

    def sample(
        self,
        pid: int | str,
        tid: int | str,
        ts_ns: int,
        stack_id: int,
        weight: int = 1,
        idle: bool = False,
    ) -> None:
        """Append a stack sample (``stack_id`` from :meth:`stack`)."""
        c = self._cols["samples"]
        c["pid"].append(self.encode_label(pid))
        c["tid"].append(self.encode_label(tid))
        c["ts_ns"].append(ts_ns)
        c["stack"].append(stack_id)
        c["weight"].append(weight)
        c["idle"].append(1 if idle else 0)

    # -- whole traces ------------------------------------------------------------------------
    def add_trace(
        self,
        trace: Trace,
        *,
        time_offset_ns: int = 0,
        skip_spans: Container[int] = (),
        skip_meta: Container[int] = (),
        pid_map: Mapping[int, int] | None = None,
        flow_id_offset: int = 0,
    ) -> None:
        """Append the events of another trace, re-interning strings and shifting to this base.

        ``time_offset_ns`` is added to every time (to align a foreign clock); spans and metadata
        events whose indices are in ``skip_spans`` / ``skip_meta`` are left out; ``pid_map``
        (source pid column value -> new int pid) renumbers processes and ``flow_id_offset`` is
        added to every flow id (to merge traces of several ranks).
        """
        shift = trace.base_time_ns - self.base_time_ns + time_offset_ns
        remap = array("I", (self.intern(s) for s in trace.strings))
        args_offset = len(self._args)
        self._args.extend(trace.args)
        ids_offset = len(self._cols["python_ids"]["id"])
        python_ids = len(trace.tables["python_ids"]["id"])

        offsets = {TIMES: shift, REFS: args_offset}
        for table, layout in TABLE_LAYOUTS.items():
            if table in ("frames", "stacks", "samples"):
                continue
            src, dst = trace.tables[table], self._cols[table]
            skip = skip_spans if table == "spans" else skip_meta if table == "meta" else ()
            keep = [i for i in range(len(src)) if i not in skip] if skip else None
            for col, code in layout:
                values: Any = src[col]
                if keep is not None:
                    values = array(code, [values[i] for i in keep])
                if col == "pid" and pid_map is not None:
                    values = array(code, map(pid_map.__getitem__, values))
                elif col == "flow_id" and flow_id_offset:
                    values = remapped(values, TIMES, None, flow_id_offset)
                else:
                    mode = _REMAP_MODES.get(col)
                    if mode is not None and (mode in (IDS, LABELS) or offsets[mode]):
                        values = remapped(values, mode, remap, offsets.get(mode, 0))
                    if col == "args" and ids_offset and python_ids:
                        values = array(code, (v - ids_offset if v < -1 else v for v in values))
                _extend(dst[col], values)
        frame_map = array("i")
        frames = trace.tables["frames"]
        for name, file, line in zip(frames["name"], frames["file"], frames["line"], strict=True):
            frame_map.append(self.frame(trace.strings[name], trace.strings[file], line))
        stack_map = array("i")
        stacks = trace.tables["stacks"]
        for parent, fid in zip(stacks["parent"], stacks["frame"], strict=True):
            mapped_parent = stack_map[parent] if parent >= 0 else -1
            key = (mapped_parent, frame_map[fid])
            sid = self._stack_ids.get(key)
            if sid is None:
                c = self._cols["stacks"]
                sid = len(c["parent"])
                c["parent"].append(mapped_parent)
                c["frame"].append(frame_map[fid])
                self._stack_ids[key] = sid
            stack_map.append(sid)
        s = trace.samples
        c = self._cols["samples"]
        if pid_map is not None:
            c["pid"].extend(map(pid_map.__getitem__, s["pid"]))
        else:
            c["pid"].extend(remapped(s["pid"], LABELS, remap, 0))
        c["tid"].extend(remapped(s["tid"], LABELS, remap, 0))
        _extend(c["ts_ns"], remapped(s["ts_ns"], TIMES, None, shift) if shift else s["ts_ns"])
        c["stack"].extend(stack_map[v] if v >= 0 else -1 for v in s["stack"])
        _extend(c["weight"], s["weight"])
        _extend(c["idle"], s["idle"])
        for meta_key, meta_value in trace.metadata.items():
            self.metadata.setdefault(meta_key, meta_value)
        if not self.device_properties:
            self.device_properties = list(trace.device_properties)
        if self.distributed_info is None:
            self.distributed_info = trace.distributed_info

    def named_tracks(self) -> tuple[set[int], set[tuple[int, int]]]:
        """Pids with a ``process_name`` and (pid, tid) pairs with a ``thread_name`` so far."""
        cols = self._cols["meta"]
        process_id, thread_id = (
            self._string_ids.get("process_name"),
            self._string_ids.get("thread_name"),
        )
        processes, threads = set(), set()
        for name, pid, tid in zip(cols["name"], cols["pid"], cols["tid"], strict=True):
            if name == process_id:
                processes.add(pid)
            elif name == thread_id:
                threads.add((pid, tid))
        return processes, threads

    @property
    def span_rows(self) -> int:
        """Spans appended so far."""
        return len(self._cols["spans"]["name"])

    def note_span_tracks(self, lo: int, hi: int, tracks: set[tuple[int, int]]) -> None:
        """Tell ``span_tracks`` the (pid, tid) values of spans ``lo..hi`` (for bulk writers)."""
        self._noted_tracks.append((lo, hi, set(tracks)))

    def span_tracks(self) -> set[tuple[int, int]]:
        """The (pid, tid) column values of the spans appended so far."""
        pids, tids = self._cols["spans"]["pid"], self._cols["spans"]["tid"]
        out: set[tuple[int, int]] = set()
        at = 0
        for lo, hi, tracks in [*sorted(self._noted_tracks), (len(pids), len(pids), set())]:
            out.update(zip(pids[at:lo], tids[at:lo], strict=True))
            out |= tracks
            at = hi
        return out

    def instants_named(self, name: str) -> Iterator[tuple[int, int, int, Mapping[str, Any] | None]]:
        """The instants appended so far with this name: ``(ts_ns, pid, tid, args)`` (encoded)."""
        wanted = self._string_ids.get(name)
        cols = self._cols["instants"]
        for i, name_id in enumerate(cols["name"]):
            if name_id == wanted:
                ref = cols["args"][i]
                yield (
                    cols["ts_ns"][i],
                    cols["pid"][i],
                    cols["tid"][i],
                    self._args[ref] if ref >= 0 else None,
                )

    def build(self) -> Trace:
        """Freeze into a read-only ``Trace`` (the builder should not be used afterwards)."""
        return Trace(
            strings=tuple(self._strings),
            tables=MappingProxyType(
                {table: Table(TABLE_LAYOUTS[table], cols) for table, cols in self._cols.items()}
            ),
            args=tuple(self._args),
            base_time_ns=self.base_time_ns,
            metadata=MappingProxyType(dict(self.metadata)),
            device_properties=tuple(self.device_properties),
            distributed_info=self.distributed_info,
            trace_name=self.trace_name,
            display_time_unit=self.display_time_unit,
        )
