"""Chrome trace files in the Kineto dialect: a streaming, atomic writer.

It emits what torch.profiler emits (``schemaVersion``, ``deviceProperties``,
``distributedInfo``, user metadata, ``displayTimeUnit``, ``baseTimeNanoseconds``,
``traceEvents``, ``traceName``), with ``ts``/``dur`` in microseconds with three decimals relative
to ``baseTimeNanoseconds``.  Spans are formatted in chunks by the C writer
(``_csrc/chrome_writer.c``) when the extension is built, else by ``format_spans_python``, which
gives the same bytes, so memory stays bounded; ``.gz`` paths are compressed in the same pass on a
second thread; the file appears under its name only once complete.
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from stepscope._ext import native
from stepscope.atomic import atomic_output, ensure_parent
from stepscope.jsonenc import json_bytes
from stepscope.trace.layouts import LABEL_BASE
from stepscope.trace.model import Trace
from stepscope.trace.sampled_spans import (
    IDLE_FRAME,
    SAMPLED_CATEGORY,
    SAMPLED_TID_BASE,
)
from stepscope.trace.sampled_spans import sampled_flame_chart as _flame_chart
from stepscope.trace.timebase import file_base

__all__ = [
    "CHUNK_EVENTS",
    "RESERVED_KEYS",
    "WriteStats",
    "format_spans_python",
    "write_chrome_trace",
]

CHUNK_EVENTS = 32768
MAX_EXACT_INT = 2**53  # the largest float whose integer part is exact
RESERVED_KEYS = frozenset(
    {
        "schemaVersion",
        "deviceProperties",
        "distributedInfo",
        "displayTimeUnit",
        "baseTimeNanoseconds",
        "traceEvents",
        "traceName",
        "stackFrames",
        "samples",
    }
)


@dataclass(frozen=True)
class WriteStats:
    """What a write produced."""

    path: str
    events: int
    bytes_written: int


def _counter_values(values: Mapping[str, float]) -> dict[str, float | int]:
    """Whole-number series as JSON integers (byte counts): readers such as HTA's validator
    reject a float where the format has an integer, and accept an integer anywhere."""
    return {
        k: int(v) if v.is_integer() and abs(v) <= MAX_EXACT_INT else v for k, v in values.items()
    }


def _micros(ns: int) -> str:
    """Integer ns as microseconds with exactly three decimals."""
    if ns < 0:
        q, r = divmod(-ns, 1000)
        return f"-{q}.{r:03d}"
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def format_spans_python(
    cols: tuple[Any, ...],
    lo: int,
    hi: int,
    strings: list[bytes],
    args: tuple[Mapping[str, Any], ...],
    fallback: Callable[[Any], bytes],
    shift: int,
) -> bytes:
    """Format spans ``lo..hi`` as ``X`` events, each followed by ``,\\n`` (pure-Python twin)."""
    names, cats, pids, tids, starts, durs, argrefs = cols
    out: list[bytes] = []
    append = out.append

    def label(v: int) -> bytes:
        return strings[v - LABEL_BASE] if v >= LABEL_BASE else str(v).encode()

    for i in range(lo, hi):
        cat = cats[i]
        ref = argrefs[i]
        append(b'{"ph":"X",')
        if cat:
            append(b'"cat":' + strings[cat] + b",")
        append(
            b'"name":%b,"pid":%b,"tid":%b,"ts":%b,"dur":%b'
            % (
                strings[names[i]],
                label(pids[i]),
                label(tids[i]),
                _micros(starts[i] + shift).encode(),
                _micros(durs[i]).encode(),
            )
        )
        if ref >= 0 and len(args[ref]):  # empty args are left out
            append(b',"args":' + fallback(args[ref]))
        append(b"},\n")
    return b"".join(out)


class _Sink:
    """Byte sink writing to a file, optionally gzip-compressing on a background thread."""

    def __init__(self, fh: IO[bytes], gzip_level: int | None) -> None:
        self._fh = fh
        self.bytes_in = 0
        self._compressor = None
        self._queue: queue.Queue[bytes | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if gzip_level is not None:
            self._compressor = zlib.compressobj(gzip_level, zlib.DEFLATED, 31)
            self._queue = queue.Queue(maxsize=4)
            self._thread = threading.Thread(
                target=self._compress_loop, name="stepscope-gzip", daemon=True
            )
            self._thread.start()

    def _compress_loop(self) -> None:
        assert self._queue is not None and self._compressor is not None
        try:
            while True:
                data = self._queue.get()
                if data is None:
                    self._fh.write(self._compressor.flush())
                    return
                self._fh.write(self._compressor.compress(data))
        except BaseException as exc:  # surfaced to the writer thread in close()/write()
            self._error = exc
            while self._queue.get() is not None:
                pass

    def write(self, data: bytes) -> None:
        self.bytes_in += len(data)
        if self._queue is None:
            self._fh.write(data)
            return
        if self._error is not None:
            raise self._error
        self._queue.put(data)

    def close(self) -> None:
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            if self._error is not None:
                raise self._error


def _header(trace: Trace, base: int) -> bytes:
    parts = [
        b'{\n"schemaVersion":%d' % trace.schema_version,
        b',\n"deviceProperties":' + json_bytes(list(trace.device_properties)),
    ]
    if trace.distributed_info is not None:
        # Default separators on purpose: HTA finds the rank by the text '"rank": N'.
        parts.append(
            b',\n"distributedInfo":'
            + json_bytes(dict(trace.distributed_info), pretty_separators=True)
        )
    for key, value in trace.metadata.items():
        if key in RESERVED_KEYS:
            raise ValueError(
                f"trace metadata key {key!r} is reserved by the Chrome trace format; rename it"
            )
        parts.append(b",\n" + json_bytes(str(key)) + b":" + json_bytes(value))
    parts.append(b',\n"displayTimeUnit":' + json_bytes(trace.display_time_unit))
    parts.append(b',\n"baseTimeNanoseconds":%d' % base)
    parts.append(b',\n"traceEvents":[\n')
    return b"".join(parts)


def _event_chunks(
    trace: Trace, shift: int, strings: list[bytes], flame_chart: bool = False
) -> Iterator[bytes]:
    """Every trace event as JSON text, each followed by ``,\\n``, in bounded chunks."""

    def label(v: int) -> bytes:
        return strings[v - LABEL_BASE] if v >= LABEL_BASE else str(v).encode()

    meta = trace.meta
    for name, pid, tid, ref in zip(
        meta["name"], meta["pid"], meta["tid"], meta["args"], strict=True
    ):
        args = b',"args":' + json_bytes(trace.args[ref]) if ref >= 0 else b""
        yield b'{"ph":"M","name":%b,"pid":%b,"tid":%b%b},\n' % (
            strings[name],
            label(pid),
            label(tid),
            args,
        )

    spans = trace.spans
    cols = tuple(spans[c] for c in ("name", "cat", "pid", "tid", "start_ns", "dur_ns", "args"))
    mod = native()
    formatter: Callable[..., bytes] = mod.format_spans if mod is not None else format_spans_python
    for lo in range(0, len(spans), CHUNK_EVENTS):
        hi = min(lo + CHUNK_EVENTS, len(spans))
        yield formatter(cols, lo, hi, strings, trace.args, json_bytes, shift)

    inst = trace.instants
    out: list[bytes] = []
    for name, cat, pid, tid, ts, scope, ref in zip(
        *(inst[c] for c in ("name", "cat", "pid", "tid", "ts_ns", "scope", "args")), strict=True
    ):
        cat_part = b'"cat":' + strings[cat] + b"," if cat else b""
        args = b',"args":' + json_bytes(trace.args[ref]) if ref >= 0 else b""
        out.append(
            b'{"ph":"i",%b"s":"%c","name":%b,"pid":%b,"tid":%b,"ts":%b%b},\n'
            % (
                cat_part,
                scope,
                strings[name],
                label(pid),
                label(tid),
                _micros(ts + shift).encode(),
                args,
            )
        )
        if len(out) >= CHUNK_EVENTS:
            yield b"".join(out)
            out.clear()

    for event in trace.iter_counter_events():
        out.append(
            b'{"ph":"C","name":%b,"pid":%b,"tid":%b,"ts":%b,"args":%b},\n'
            % (
                json_bytes(event.name),
                json_bytes(event.pid),
                json_bytes(event.tid),
                _micros(event.ts_ns + shift).encode(),
                json_bytes(_counter_values(event.values)),
            )
        )
        if len(out) >= CHUNK_EVENTS:
            yield b"".join(out)
            out.clear()

    flows = trace.flows
    for name, cat, pid, tid, ts, fid, phase, binding in zip(
        *(flows[c] for c in ("name", "cat", "pid", "tid", "ts_ns", "flow_id", "phase", "binding")),
        strict=True,
    ):
        bp = b',"bp":"e"' if binding else b""
        cat_part = b',"cat":' + strings[cat] if cat else b""
        out.append(
            b'{"ph":"%c","id":%d,"pid":%b,"tid":%b,"ts":%b%b,"name":%b%b},\n'
            % (
                phase,
                fid,
                label(pid),
                label(tid),
                _micros(ts + shift).encode(),
                cat_part,
                strings[name],
                bp,
            )
        )
        if len(out) >= CHUNK_EVENTS:
            yield b"".join(out)
            out.clear()
    if out:
        yield b"".join(out)
    if flame_chart:
        yield from _sampled_chunks(trace, shift, strings)


def _sampled_chunks(trace: Trace, shift: int, strings: list[bytes]) -> Iterator[bytes]:
    """The samples as a flame chart per thread (what Perfetto can show of them)."""
    spans, tracks = _flame_chart(trace)
    if not spans:
        return
    cat = json_bytes(SAMPLED_CATEGORY)
    out: list[bytes] = []
    for track in tracks:
        pid, tid = trace.label(track.pid), json_bytes(track.track)
        for name, args in (
            ("thread_name", {"name": track.name}),
            ("thread_sort_index", {"sort_index": _sort_index(track.tid)}),
        ):
            out.append(
                b'{"ph":"M","cat":%b,"name":"%b","pid":%b,"tid":%b,"args":%b},\n'
                % (cat, name.encode(), json_bytes(pid), tid, json_bytes(args))
            )
    idle = json_bytes(IDLE_FRAME)
    for span in spans:
        out.append(
            b'{"ph":"X","cat":%b,"name":%b,"pid":%b,"tid":%b,"ts":%b,"dur":%b},\n'
            % (
                cat,
                strings[span.name] if span.name >= 0 else idle,
                json_bytes(trace.label(span.pid)),
                json_bytes(span.track),
                _micros(span.start_ns + shift).encode(),
                _micros(span.dur_ns).encode(),
            )
        )
        if len(out) >= CHUNK_EVENTS:
            yield b"".join(out)
            out.clear()
    if out:
        yield b"".join(out)


def _sort_index(tid: int | str) -> int:
    """Sort a thread's flame-chart track right after the thread."""
    return tid + 1 if isinstance(tid, int) and 0 <= tid < SAMPLED_TID_BASE else SAMPLED_TID_BASE


def _samples_sections(trace: Trace, shift: int) -> bytes:
    """Top-level ``stackFrames`` and ``samples`` (Trace Event Format) when there are samples."""
    samples = trace.samples
    if not len(samples):
        return b""
    stacks, frames = trace.tables["stacks"], trace.tables["frames"]
    frame_entries = []
    for sid, (parent, fid) in enumerate(zip(stacks["parent"], stacks["frame"], strict=True)):
        entry: dict[str, Any] = {
            "name": trace.strings[frames["name"][fid]],
            "category": trace.strings[frames["file"][fid]],
            "line": frames["line"][fid],
        }
        if parent >= 0:
            entry["parent"] = str(parent)
        frame_entries.append(json_bytes(str(sid)) + b":" + json_bytes(entry))
    rows = []
    for pid, tid, ts, stack, weight, idle in zip(
        *(samples[c] for c in ("pid", "tid", "ts_ns", "stack", "weight", "idle")), strict=True
    ):
        row: dict[str, Any] = {
            "pid": trace.label(pid),
            "tid": trace.label(tid),
            "ts": float(_micros(ts + shift)),
            "name": "idle" if idle else "sample",
            "weight": weight,
        }
        if stack >= 0:
            row["sf"] = str(stack)
        rows.append(json_bytes(row))
    return (
        b',\n"stackFrames":{'
        + b",\n".join(frame_entries)
        + b"}"
        + b',\n"samples":[\n'
        + b",\n".join(rows)
        + b"\n]"
    )


def write_chrome_trace(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    gzip_level: int = 1,
    fsync: bool = False,
    sampled_flame_chart: bool = True,
) -> WriteStats:
    """Write ``trace`` to ``path`` (gzip if it ends in ``.gz``), atomically; returns sizes.

    Stack samples are written as the format's top-level ``stackFrames``/``samples`` and, with
    ``sampled_flame_chart``, also as a flame chart of spans per thread (category
    ``stepscope_sampled``), which is what Perfetto displays; the reader skips those spans.
    """
    target = ensure_parent(path, "trace")
    use_gzip = target.name.endswith(".gz")
    if use_gzip and not 0 <= gzip_level <= 9:
        raise ValueError(f"gzip_level must be between 0 and 9, got {gzip_level}")
    base = file_base(trace)
    shift = trace.base_time_ns - base
    strings = [json_bytes(s) for s in trace.strings]
    events = 0
    with atomic_output(target, what="trace", fsync=fsync) as fh:
        sink = _Sink(fh, gzip_level if use_gzip else None)
        try:
            sink.write(_header(trace, base))
            pending = b""
            for chunk in _event_chunks(trace, shift, strings, sampled_flame_chart):
                if pending:
                    sink.write(pending)
                pending = chunk
                events += chunk.count(b"},\n")
            if pending:
                sink.write(pending[:-2] + b"\n")  # no comma after the last event
            sink.write(b"]")
            sink.write(_samples_sections(trace, shift))
            name = trace.trace_name if trace.trace_name is not None else str(target)
            sink.write(b',\n"traceName":' + json_bytes(name) + b"\n}\n")
        finally:
            sink.close()
    return WriteStats(str(target), events, sink.bytes_in)
