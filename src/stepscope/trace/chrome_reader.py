"""Chrome trace files in the Kineto dialect: the reader (stepscope's files and torch.profiler's).

With the C extension, the scanner (``_csrc/chrome_scanner.c``, lexing in ``chrome_json.c``)
walks the document once and turns plain events of every phase (``X``, ``B``/``E``, instants,
counters, flows, ``M``) into table columns, their args kept as JSON text; what it leaves goes
to the per-event reader below.  A document it cannot scan goes to ``json.loads`` and the bulk
span reader (``_csrc/chrome_columns.c``, twin ``spans_from_events_python``) for its ``X``
events; every other event is then read one by one.  The ``samples`` list beside the events is
scanned in C as well (``_csrc/chrome_samples.c``); its ``sf`` keys are resolved against
``stackFrames`` here.  Any failure is a ``ChromeTraceError`` naming the file and the position.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import zlib
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stepscope._ext import native
from stepscope.gcpause import gc_paused
from stepscope.jsonenc import utf8
from stepscope.trace.chrome_writer import RESERVED_KEYS
from stepscope.trace.kineto import drop_bookkeeping
from stepscope.trace.layouts import LABEL_BASE, SPAN_COLUMNS
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.raw_args import RawArgs
from stepscope.trace.sampled_spans import SAMPLED_CATEGORY

__all__ = [
    "MAX_INFLATE_RATIO",
    "MIN_INFLATE_LIMIT",
    "ChromeTraceError",
    "read_chrome_trace",
    "spans_from_events_python",
]


class ChromeTraceError(ValueError):
    """A Chrome trace file could not be read: says which file, where, and what was wrong."""


MAX_INFLATE_RATIO = 100
"""A ``.gz`` trace may inflate to this many times its size (JSON traces compress 5-30x) ..."""
MIN_INFLATE_LIMIT = 256 << 20
"""... or to this many bytes, whichever is more; ``max_inflated_bytes=`` sets a limit instead."""


INFLATE_PIECE = 8 << 20
"""Bytes inflated per call (a bomb's refusal then peaks just above the limit)."""


def _load_bytes(path: Path, max_inflated_bytes: int | None) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ChromeTraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise ChromeTraceError(f"{path}: is a directory, not a trace file") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    limit = max_inflated_bytes
    if limit is None:
        limit = max(MIN_INFLATE_LIMIT, MAX_INFLATE_RATIO * len(raw))
    return _inflate(path, raw, limit)


def _inflate(path: Path, raw: bytes, limit: int) -> bytes:
    """Every gzip member of ``raw``, at most ``limit`` bytes in all; anything else is an error."""
    out: list[bytes] = []
    size = 0
    pending = raw
    while True:
        decomp = zlib.decompressobj(31)
        while True:
            try:
                # bounded pieces: one call for the whole limit would peak at twice the limit
                chunk = decomp.decompress(pending, min(INFLATE_PIECE, limit + 1 - size))
            except zlib.error as exc:
                raise ChromeTraceError(f"{path}: corrupt gzip data ({exc})") from None
            size += len(chunk)
            out.append(chunk)
            if size > limit:
                raise ChromeTraceError(
                    f"{path}: gzip data inflates to more than {limit} bytes (from {len(raw)}); "
                    "pass read_chrome_trace(..., max_inflated_bytes=N) to read it anyway"
                )
            pending = decomp.unconsumed_tail
            if decomp.eof or not pending:
                break
        if not decomp.eof:
            raise ChromeTraceError(
                f"{path}: gzip stream is truncated (file ends at byte {len(raw)} before the end "
                f"of the compressed data; {size} bytes decompressed); the file is incomplete"
            )
        pending = decomp.unused_data
        if not pending:
            return b"".join(out)
        if pending[:2] != b"\x1f\x8b":
            raise ChromeTraceError(
                f"{path}: {len(pending)} bytes of trailing data after the gzip stream "
                f"(at byte {len(raw) - len(pending)})"
            )


def _ns(value: Any, what: str, index: int, path: Path) -> int:
    ns = _plain_us(value)
    if ns is None:
        raise ChromeTraceError(
            f"{path}: traceEvents[{index}]: {what} must be a finite number of microseconds "
            f"(|value| < {_MAX_US}), got {value!r}"
        )
    return ns


def _label(value: Any, what: str, index: int, path: Path) -> int | str:
    label = _plain_label(value)
    if label is None:
        raise ChromeTraceError(
            f"{path}: traceEvents[{index}]: {what} must be an integer (|value| < 2**62) or a "
            f"string, got {value!r}"
        )
    return label


def _str(value: Any, what: str, index: int, path: Path) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ChromeTraceError(
            f"{path}: traceEvents[{index}]: {what} must be a string, got {value!r}"
        )
    return value


def _args(value: Any, index: int, path: Path) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ChromeTraceError(f"{path}: traceEvents[{index}]: args must be an object")
    return value


def read_chrome_trace(
    path: str | os.PathLike[str],
    *,
    drop_kineto_bookkeeping: bool = False,
    max_inflated_bytes: int | None = None,
) -> Trace:
    """Load a ``.json`` or ``.json.gz`` Chrome trace (stepscope's or torch.profiler's).

    ``drop_kineto_bookkeeping`` leaves Kineto's bookkeeping keys out of ``X`` and ``i`` events' args
    (see ``stepscope.trace.kineto``), as a merge of torch's trace into stepscope's does.
    A ``.gz`` file may inflate to ``max_inflated_bytes`` (default: ``MAX_INFLATE_RATIO`` times
    its size or ``MIN_INFLATE_LIMIT``, whichever is more).  Every failure to read is a
    ``ChromeTraceError`` naming the file.
    """
    if max_inflated_bytes is not None and (
        isinstance(max_inflated_bytes, bool)
        or not isinstance(max_inflated_bytes, int)
        or max_inflated_bytes < 1
    ):
        raise ValueError(f"max_inflated_bytes must be a positive int, got {max_inflated_bytes!r}")
    p = Path(path)
    data = _load_bytes(p, max_inflated_bytes)
    # Parsing allocates one container per event: with the cyclic GC on, a large heap (torch
    # loaded) is rescanned many times over.  Nothing parsed here can form a cycle.
    with gc_paused():
        try:
            return _read_document(p, data, drop_kineto_bookkeeping)
        except ChromeTraceError:
            raise
        except RecursionError:
            raise ChromeTraceError(f"{p}: JSON nested too deeply to read") from None
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError) as exc:
            # a value of a shape no check above anticipated: still a clean, named error
            raise ChromeTraceError(f"{p}: unreadable value: {type(exc).__name__}: {exc}") from None


def _loads(p: Path, data: bytes) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= len(data) - 1 else ""
        raise ChromeTraceError(
            f"{p}: invalid JSON at line {exc.lineno} column {exc.colno} (byte {exc.pos}): "
            f"{exc.msg}{hint}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ChromeTraceError(f"{p}: not UTF-8 text at byte {exc.start}: {exc.reason}") from None
    except RecursionError:
        raise ChromeTraceError(f"{p}: JSON nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ChromeTraceError(f"{p}: a JSON value cannot be read: {exc}") from None


_Tables = list[tuple[str, tuple[bytes, ...]]]
_Samples = tuple[tuple[bytes, ...], list[str]] | None
_EventsRead = tuple[Any, TraceBuilder, list[tuple[int, Any]], _Tables, dict[str, int], _Samples]

SCANNED_TABLES = ("spans", "instants", "flows", "meta", "counters", "spans")
"""The tables the C scanner fills, in the order it returns their columns (the spans closed from
``B``/``E`` pairs after the ``X`` spans)."""


def _scan_events(p: Path, data: bytes, drop: bool) -> _EventsRead:
    """(document, builder, events left for the per-event reader, (table, columns) of the events
    read in bulk, the unmatched ``B``/``E`` events counted so far).

    The C scanner reads plain events of every phase without building their objects (args stay
    JSON text); its twin is ``json.loads``, ``spans_from_events`` for the ``X`` events and the
    per-event reader for the rest, used when it is absent or declines.  Both give the same
    tables in the same order (strings and args may be numbered differently).
    """
    mod = native()
    if mod is not None:
        b = TraceBuilder(base_time_ns=0)
        try:
            scanned = mod.scan_trace(
                data, *b.bulk_tables(), SAMPLED_CATEGORY, RawArgs, json.loads, string_flow_id, drop
            )
        except RecursionError:
            raise ChromeTraceError(f"{p}: JSON nested too deeply to read") from None
        except ValueError as exc:  # json.loads of one event, e.g. a 4300+-digit integer
            raise ChromeTraceError(f"{p}: a JSON value cannot be read: {exc}") from None
        if scanned is not None:
            head, rest, tables, (ends, begins), samples = scanned
            unmatched = {"E(unmatched)": ends, "B(unmatched)": begins}
            skipped = {k: n for k, n in unmatched.items() if n}
            pairs = list(zip(SCANNED_TABLES, tables, strict=True))
            return _loads(p, head), b, rest, pairs, skipped, samples
    doc = _loads(p, data)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return doc, TraceBuilder(base_time_ns=0), [], [], {}, None
    if drop:
        for ev in events:
            if type(ev) is dict and ev.get("ph") in ("X", "i") and type(ev.get("args")) is dict:
                drop_bookkeeping(ev["args"])
    b = TraceBuilder(base_time_ns=0)
    reader: Callable[..., tuple[list[int], tuple[bytes, ...]]] = (
        mod.spans_from_events if mod is not None else spans_from_events_python
    )
    indices, span_columns = reader(events, *b.bulk_tables(), SAMPLED_CATEGORY)
    return doc, b, [(i, events[i]) for i in indices], [("spans", span_columns)], {}, None


def _read_document(p: Path, data: bytes, drop: bool) -> Trace:
    doc, b, rest, tables, skipped, samples = _scan_events(p, data, drop)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ChromeTraceError(
            f"{p}: not a Chrome trace: expected an object with a 'traceEvents' list "
            "or a list of events"
        )
    base = doc.get("baseTimeNanoseconds", 0)
    if isinstance(base, bool) or not isinstance(base, int):
        raise ChromeTraceError(f"{p}: baseTimeNanoseconds must be an integer, got {base!r}")
    b.base_time_ns = base
    b.trace_name = doc.get("traceName") if isinstance(doc.get("traceName"), str) else None
    b.display_time_unit = str(doc.get("displayTimeUnit", "ms"))
    props = doc.get("deviceProperties", [])
    b.device_properties = list(props) if isinstance(props, list) else []
    dist = doc.get("distributedInfo")
    b.distributed_info = dist if isinstance(dist, dict) else None
    for key, value in doc.items():
        if key not in RESERVED_KEYS:
            b.metadata[key] = value
    _read_events(rest, tables, skipped, b, p)
    if samples is not None:
        _add_scanned_samples(doc, b, p, *samples)
    _read_samples(doc, b, p)
    if skipped:
        b.metadata["stepscope_skipped_events"] = skipped
    return b.build()


# Largest |microseconds| whose nanoseconds fit the int64 time columns.
_MAX_US = (2**63 - 1) // 1000
_MAX_NS_FLOAT = 9.2e18


def _plain_us(value: Any) -> int | None:
    """Nanoseconds of a plain time (int, or finite float in range), else None."""
    if type(value) is int:
        return value * 1000 if -_MAX_US <= value <= _MAX_US else None
    if type(value) is float:
        ns = value * 1000
        return round(ns) if math.isfinite(ns) and abs(ns) < _MAX_NS_FLOAT else None
    return None


def _plain_label(value: Any) -> int | str | None:
    """A pid/tid as stored (an int in range, an integral float as int, a str), else None."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int:
        return value if -LABEL_BASE <= value < LABEL_BASE else None
    return value if type(value) is str else None


def spans_from_events_python(
    events: list[Any],
    string_ids: dict[str, int],
    strings: list[str],
    args_store: list[Any],
    skip_cat: str,
) -> tuple[list[int], tuple[bytes, ...]]:
    """Plain ``X`` events to span-column bytes, interning in place; the indices of the rest.

    Twin of the C ``spans_from_events``: plain means a string or absent name and cat (not
    ``skip_cat``), an integer or string pid/tid, finite ts/dur and object or absent args.
    """
    cols = tuple(array(code) for _, code in SPAN_COLUMNS)
    name_col, cat_col, pid_col, tid_col, start_col, dur_col, args_col = cols
    rest: list[int] = []

    def intern(text: str) -> int:
        sid = string_ids.get(text)
        if sid is None:
            sid = string_ids[text] = len(strings)
            strings.append(text)
        return sid

    for i, ev in enumerate(events):
        if type(ev) is not dict or ev.get("ph") != "X":
            rest.append(i)
            continue
        name, cat, args = ev.get("name"), ev.get("cat"), ev.get("args")
        pid, tid = _plain_label(ev.get("pid", 0)), _plain_label(ev.get("tid", 0))
        start = _plain_us(ev.get("ts"))
        dur = _plain_us(ev.get("dur", 0))
        if not (
            (name is None or type(name) is str)
            and (cat is None or (type(cat) is str and cat != skip_cat))
            and pid is not None
            and tid is not None
            and start is not None
            and dur is not None
            and (args is None or type(args) is dict)
        ):
            rest.append(i)
            continue
        name_col.append(0 if name is None else intern(name))
        cat_col.append(0 if cat is None else intern(cat))
        pid_col.append(LABEL_BASE + intern(pid) if isinstance(pid, str) else pid)
        tid_col.append(LABEL_BASE + intern(tid) if isinstance(tid, str) else tid)
        start_col.append(start)
        dur_col.append(dur)
        if args is None:
            args_col.append(-1)
        else:
            args_col.append(len(args_store))
            args_store.append(args)
    return rest, tuple(col.tobytes() for col in cols)


def _read_events(
    rest: list[tuple[int, Any]], tables: _Tables, skipped: dict[str, int], b: TraceBuilder, p: Path
) -> None:
    """Add the bulk-read tables, then read the rest one by one in file order, counting what is
    skipped into ``skipped``.

    Spans closed from ``B``/``E`` pairs come after the ``X`` spans; an event of a bulk-read
    phase that the bulk readers leave is one the per-event reader skips or rejects with a clear
    error, so each table keeps the file's order.
    """
    open_begins: _OpenBegins = {}  # B events waiting for their E, per (pid, tid)
    for table, columns in tables:
        b.extend_table_bytes(table, columns)
    _read_event_list(rest, b, p, skipped, open_begins)
    unmatched = sum(len(s) for s in open_begins.values())
    if unmatched:
        skipped["B(unmatched)"] = skipped.get("B(unmatched)", 0) + unmatched


_OpenBegins = dict[tuple[int | str, int | str], list[tuple[str, str, int, Any]]]


def _read_event_list(
    events: list[tuple[int, Any]],
    b: TraceBuilder,
    p: Path,
    skipped: dict[str, int],
    open_begins: _OpenBegins,
) -> None:
    """Read events one by one (validating each); ``events`` pairs each with its index."""
    for i, ev in events:
        if type(ev) is not dict:
            raise ChromeTraceError(f"{p}: traceEvents[{i}] is not an object: {ev!r:.80}")
        if ev.get("cat") == SAMPLED_CATEGORY:
            continue  # the flame chart is drawn again from the samples
        ph = ev.get("ph")
        if ph == "X":
            b.span(
                _str(ev.get("name"), "name", i, p),
                _str(ev.get("cat"), "cat", i, p),
                _label(ev.get("pid", 0), "pid", i, p),
                _label(ev.get("tid", 0), "tid", i, p),
                _ns(ev.get("ts"), "ts", i, p),
                _ns(ev.get("dur", 0), "dur", i, p),
                _args(ev.get("args"), i, p),
            )
        elif ph in ("i", "I", "n"):
            scope = ev.get("s", "t")
            b.instant(
                _str(ev.get("name"), "name", i, p),
                _str(ev.get("cat"), "cat", i, p),
                _label(ev.get("pid", 0), "pid", i, p),
                _label(ev.get("tid", 0), "tid", i, p),
                _ns(ev.get("ts"), "ts", i, p),
                scope if scope in ("t", "p", "g") else "t",
                _args(ev.get("args"), i, p),
            )
        elif ph == "C":
            values = _args(ev.get("args"), i, p) or {}
            numeric = {
                k: number for k, v in values.items() if (number := _counter_value(v)) is not None
            }
            if numeric:
                b.counter(
                    _str(ev.get("name"), "name", i, p),
                    _label(ev.get("pid", 0), "pid", i, p),
                    _ns(ev.get("ts"), "ts", i, p),
                    numeric,
                    tid=_label(ev.get("tid", 0), "tid", i, p),
                )
            else:
                skipped["C(no numeric values)"] = skipped.get("C(no numeric values)", 0) + 1
        elif ph in ("s", "t", "f"):
            fid = _flow_id(ev.get("id", 0), i, p)
            b.flow(
                _str(ev.get("name"), "name", i, p),
                _str(ev.get("cat"), "cat", i, p),
                _label(ev.get("pid", 0), "pid", i, p),
                _label(ev.get("tid", 0), "tid", i, p),
                _ns(ev.get("ts"), "ts", i, p),
                fid,
                ph,
                "e" if ev.get("bp") == "e" else "",
            )
        elif ph == "M":
            b.meta_event(
                _str(ev.get("name"), "name", i, p),
                _label(ev.get("pid", 0), "pid", i, p),
                _label(ev.get("tid", 0), "tid", i, p),
                _args(ev.get("args"), i, p) or {},
            )
        elif ph in ("B", "E"):
            key = (_label(ev.get("pid", 0), "pid", i, p), _label(ev.get("tid", 0), "tid", i, p))
            ts = _ns(ev.get("ts"), "ts", i, p)
            stack = open_begins.setdefault(key, [])
            if ph == "B":
                name = _str(ev.get("name"), "name", i, p)
                stack.append((name, _str(ev.get("cat"), "cat", i, p), ts, ev.get("args")))
            elif stack:
                name, cat, start, args = stack.pop()
                b.span(name, cat, key[0], key[1], start, ts - start, _args(args, i, p))
            else:
                skipped["E(unmatched)"] = skipped.get("E(unmatched)", 0) + 1
        else:
            label = str(ph)
            skipped[label] = skipped.get(label, 0) + 1


_MAX_FLOW_ID = 2**63 - 1


def _flow_id(value: Any, index: int, path: Path) -> int:
    """A flow id as an int: an int64 as it is, a string as its number or a stable hash of it."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and -_MAX_FLOW_ID <= value <= _MAX_FLOW_ID:
        return value
    if type(value) is str:
        return string_flow_id(value)
    raise ChromeTraceError(
        f"{path}: traceEvents[{index}]: id must be an integer (|value| < 2**63) or a string, "
        f"got {value!r:.80}"
    )


def string_flow_id(value: str) -> int:
    """A string flow id as an int: its number (``int(value, 0)``) when in range, else a hash."""
    with contextlib.suppress(ValueError):
        number = int(value, 0)
        if -_MAX_FLOW_ID <= number <= _MAX_FLOW_ID:
            return number
    digest = hashlib.blake2b(utf8(value), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2  # stable across processes, never negative


def _counter_value(value: Any) -> float | None:
    """A counter event's number as a float, or None for what is not one (bools, huge ints)."""
    if type(value) is float:
        return value
    if type(value) is int:
        with contextlib.suppress(OverflowError):
            return float(value)
    return None


def _stack_resolver(doc: dict[str, Any], b: TraceBuilder, p: Path) -> Callable[[str], int]:
    """The stack id of a sample's ``sf`` key, from the document's ``stackFrames`` (cached)."""
    frames = doc.get("stackFrames")
    if frames is None:
        frames = {}
    if not isinstance(frames, dict):
        raise ChromeTraceError(f"{p}: stackFrames must be an object, got {type(frames).__name__}")
    resolved: dict[str, int] = {}

    def frame_entry(key: str) -> dict[str, Any]:
        entry = frames[key]
        if not isinstance(entry, dict):
            raise ChromeTraceError(f"{p}: stackFrames[{key!r}] is not an object")
        return entry

    def stack_id(sf: str) -> int:
        if sf in resolved:
            return resolved[sf]
        chain: list[dict[str, Any]] = []
        cur: str | None = sf
        seen = set()
        while cur is not None and cur in frames and cur not in seen:
            seen.add(cur)
            entry = frame_entry(cur)
            chain.append(entry)
            parent = entry.get("parent")
            cur = str(parent) if parent is not None else None
        if not chain:
            raise ChromeTraceError(f"{p}: sample refers to unknown stack frame {sf!r}")
        chain.reverse()
        ids = []
        for e in chain:
            line = _int_field(e.get("line", 0), f"stackFrames[{sf!r}] line", p)
            ids.append(b.frame(str(e.get("name", "")), str(e.get("category", "")), line))
        sid = b.stack(ids)
        resolved[sf] = sid
        return sid

    return stack_id


def _add_scanned_samples(
    doc: dict[str, Any], b: TraceBuilder, p: Path, columns: tuple[bytes, ...], keys: list[str]
) -> None:
    """Samples the C scanner read: their ``sf`` keys resolved to stacks in first-seen order."""
    if not columns[5]:  # no samples
        return
    stack_id = _stack_resolver(doc, b, p)
    stacks = [stack_id(key) for key in keys]
    sf = array("i")
    sf.frombytes(columns[3])
    stack = array("i", [stacks[i] if i >= 0 else -1 for i in sf])
    b.extend_table_bytes("samples", (*columns[:3], stack.tobytes(), *columns[4:]))


def _read_samples(doc: dict[str, Any], b: TraceBuilder, p: Path) -> None:
    samples = doc.get("samples")
    if samples is None or samples == []:
        return
    if not isinstance(samples, list):
        raise ChromeTraceError(f"{p}: samples must be a list, got {type(samples).__name__}")
    stack_id = _stack_resolver(doc, b, p)

    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            raise ChromeTraceError(f"{p}: samples[{i}] is not an object")
        sf = s.get("sf")
        sid = stack_id(str(sf)) if sf is not None else -1
        pid, tid, ts = s.get("pid", 0), s.get("tid", 0), s.get("ts", 0)
        pid_label, tid_label, ts_ns = _plain_label(pid), _plain_label(tid), _plain_us(ts)
        for what, value, ok in (
            ("pid", pid, pid_label),
            ("tid", tid, tid_label),
            ("ts", ts, ts_ns),
        ):
            if ok is None:
                raise ChromeTraceError(f"{p}: samples[{i}]: bad {what} {value!r:.80}")
        b.sample(
            pid_label,  # type: ignore[arg-type]
            tid_label,  # type: ignore[arg-type]
            ts_ns,  # type: ignore[arg-type]
            sid,
            _int_field(s.get("weight", 1), f"samples[{i}] weight", p),
            s.get("name") == "idle",
        )


def _int_field(value: Any, what: str, path: Path) -> int:
    """An integer field in int64 range, else a ChromeTraceError naming it."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and -_MAX_FLOW_ID <= value <= _MAX_FLOW_ID:
        return value
    raise ChromeTraceError(f"{path}: {what} must be an integer, got {value!r:.80}")
