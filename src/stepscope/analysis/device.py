"""Device time: kernels, memcpys and memsets per device and stream, with HTA's definitions.

Which events run on a device, and their types, follow HolisticTraceAnalysis 0.5.0 exactly, so
the numbers are the ones ``TraceAnalysis.get_temporal_breakdown`` and
``get_gpu_kernel_breakdown`` give on the same trace:

- A *device event* is a span (not Kineto's ``Trace`` span) whose ``stream`` arg converts to an
  integer other than -1 (``"0x0"`` does not convert: a HIP runtime call on the CPU).  CUDA
  sync events on a stream count, as in HTA.
- Times are whole microseconds as HTA reads them: start rounded up, end rounded down.
- Type by name: ``^nccl.*Kernel`` communication; ``^Memcpy``, ``^Memset``, ``^dma`` memory;
  otherwise computation, except names matching ``^(Memcpy|Memset)``-anywhere or ``Sync``
  (HTA's ``OTHER``: synchronisation, counted as busy but neither computation nor memory).
- Temporal breakdown of a set of device events: ``span`` = last end - first start; ``idle`` =
  span - the union of all events; ``compute`` = the union of computation events;
  ``non_compute`` = the rest.
- Kernel-type breakdown: the time during which exactly a given set of types ran (union per
  type, then a sweep), e.g. ``COMPUTATION overlapping COMMUNICATION``; shares of the total.
- Which events (``hta_selection``): with two or more distinct ``ProfilerStep`` names, HTA keeps
  the device events launched (same ``correlation`` as a CPU event) by CPU events that start
  before the last step begins (``include_last_step=False``, HTA's default) or at or before it
  ends (``True``), and the CPU-side events with a ``stream`` but no correlation that start
  then; otherwise every device event.
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from stepscope.analysis.result import (
    Category,
    DeviceBreakdown,
    KernelTypeTime,
    StreamBreakdown,
)
from stepscope.trace.model import Trace
from stepscope.trace.raw_args import arg_reader, arg_rows

__all__ = [
    "COMMUNICATION",
    "COMPUTATION",
    "MEMORY",
    "OTHER",
    "DeviceEvents",
    "PositionIndex",
    "breakdown",
    "device_breakdowns",
    "device_events",
    "hta_selection",
    "hta_times",
    "kernel_type",
    "merge_intervals",
    "position_index",
    "step_device_categories",
]

COMMUNICATION = "COMMUNICATION"
MEMORY = "MEMORY"
COMPUTATION = "COMPUTATION"
OTHER = "OTHER"

_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})
_DEVICE_KEYS = ("stream", "correlation", "device")
"""The args a span is placed on a device stream by (HTA's ``stream``, ``correlation``)."""
_TYPE_BITS = ((COMPUTATION, 1), (COMMUNICATION, 2), (MEMORY, 4))


def kernel_type(name: str) -> str:
    """HTA's kernel type of a device event name."""
    if _COMM.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER


def _as_stream(value: object) -> int:
    if value is None or isinstance(value, bool):
        return -1
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError, OverflowError):
        return -1


def _as_int(value: object, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


@dataclass(frozen=True)
class DeviceEvents:
    """Spans with a stream (device events) and the CPU spans carrying correlation ids.

    ``index`` are span indices; ``start``/``end`` are ns rounded to whole µs as HTA reads them;
    ``raw_start`` is the span's own start.
    """

    index: list[int]
    device: list[str]
    stream: list[int]
    start: list[int]
    end: list[int]
    raw_start: list[int]
    correlation: list[int]
    kind: list[str]
    name: list[str]
    cpu_correlation: dict[int, int]
    """correlation id -> the CPU span (runtime call) that launched it (first seen)."""
    cpu_correlation_count: dict[int, int]
    """correlation id -> how many CPU spans carry it (HTA joins on it)."""
    cpu_stream_events: list[int]
    """Positions (in the lists above) of device events that HTA reads as CPU events (a stream
    but no correlation id)."""
    step_spans: list[int]
    """CPU spans whose name contains ``ProfilerStep``."""
    span_correlation: array[int] = field(default_factory=lambda: array("q"))
    """Every span's ``correlation`` arg as an integer (-1: none); spans of category ``Trace``
    are not read (-2).  Empty when not computed."""

    def __len__(self) -> int:
        return len(self.index)


def hta_times(start_ns: int, dur_ns: int) -> tuple[int, int]:
    """(start, end) in ns as HTA reads a span: float µs, start rounded up, ``ts + dur`` down.

    The reader stored ``round(ts * 1000)``; the float ``ts`` it came from is recovered (the
    nearest float that rounds to the same ns) so that the float sums HTA makes round the same
    way on microsecond timestamps since the epoch.
    """
    us = start_ns / 1000
    ts = us
    if round(us * 1000) != start_ns:
        below = above = us
        for _ in range(4):
            below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
            if round(below * 1000) == start_ns:
                ts = below
                break
            if round(above * 1000) == start_ns:
                ts = above
                break
    start = math.ceil(ts)
    end = math.floor(ts + dur_ns / 1000)
    return start * 1000, max(end, start) * 1000


def device_events(trace: Trace) -> DeviceEvents:
    """Find the device events of a trace (HTA's ``stream != -1``) and the CPU correlation ids."""
    spans = trace.spans
    names, cats, argrefs = spans["name"], spans["cat"], spans["args"]
    pids, starts, durs = spans["pid"], spans["start_ns"], spans["dur_ns"]
    strings = trace.strings
    all_args = trace.args
    trace_cat = {i for i, s in enumerate(strings) if s == "Trace"}
    step_names = {i for i, s in enumerate(strings) if "ProfilerStep" in s}
    sync_names = {i for i, s in enumerate(strings) if s in _SYNC_NAMES}
    kinds: dict[int, str] = {}
    labels: dict[int, str] = {}
    out = DeviceEvents([], [], [], [], [], [], [], [], [], {}, {}, [], [])
    cpu_correlation, cpu_count = out.cpu_correlation, out.cpu_correlation_count
    span_correlation = out.span_correlation
    span_correlation.extend(array("q", [-1]) * len(spans))
    refs = argrefs.tolist()
    # every span's stream, correlation and device in one pass over the args' text
    read = arg_rows([all_args[ref] if ref >= 0 else None for ref in refs], _DEVICE_KEYS)
    columns = zip(cats.tolist(), refs, names.tolist(), read, strict=True)
    for i, (cat, ref, name_id, (raw_stream, raw_correlation, device)) in enumerate(columns):
        if cat in trace_cat:
            span_correlation[i] = -2
            continue
        if ref < 0:
            stream = correlation = -1
            device = None
        else:
            # plain ints (not bools) as they are; anything else as _as_stream / _as_int say
            if raw_stream is None:
                stream = -1
            elif type(raw_stream) is int:
                stream = raw_stream
            else:
                stream = _as_stream(raw_stream)
            if raw_correlation is None:
                correlation = -1
            elif type(raw_correlation) is int:
                correlation = raw_correlation
            else:
                correlation = _as_int(raw_correlation)
            span_correlation[i] = correlation
        is_gpu = (stream >= 0 and correlation >= 0) or name_id in sync_names
        if stream != -1:
            name = strings[name_id]
            kind = kinds.get(name_id)
            if kind is None:
                kind = kinds[name_id] = kernel_type(name)
            if device is not None:
                where = str(device)
            else:
                pid = pids[i]
                where = labels.get(pid, "")
                if not where:
                    where = labels[pid] = str(trace.label(pid))
            out.index.append(i)
            out.device.append(where)
            out.stream.append(stream)
            start, end = hta_times(starts[i], durs[i])
            out.start.append(start)
            out.end.append(end)
            out.raw_start.append(starts[i])
            out.correlation.append(correlation)
            out.kind.append(kind)
            out.name.append(name)
            if not is_gpu:
                out.cpu_stream_events.append(len(out.index) - 1)
        if not is_gpu:
            if correlation >= 0:
                if correlation in cpu_count:
                    cpu_count[correlation] += 1
                else:
                    cpu_correlation[correlation] = i
                    cpu_count[correlation] = 1
            if name_id in step_names:
                out.step_spans.append(i)
    return out


def hta_selection(trace: Trace, events: DeviceEvents, include_last_step: bool) -> list[int]:
    """Positions of the device events HTA analyses (see the module docstring)."""
    spans = trace.spans
    starts, durs, names = spans["start_ns"], spans["dur_ns"], spans["name"]
    if len({names[i] for i in events.step_spans}) <= 1:
        return list(range(len(events)))
    step_times = [hta_times(starts[i], durs[i]) for i in events.step_spans]
    last_start = max(start for start, _ in step_times)
    last_end = max(end for _, end in step_times)

    ceil = math.ceil

    def kept(span: int) -> bool:
        start_ns = starts[span]
        us = start_ns / 1000
        # hta_times(start_ns, 0)[0], its first case inlined
        start = ceil(us) * 1000 if round(us * 1000) == start_ns else hta_times(start_ns, 0)[0]
        return start <= last_end if include_last_step else start < last_start

    cpu_stream = set(events.cpu_stream_events)
    kept_correlations = _kept_correlations(trace, events, kept)
    chosen: list[int] = []
    for pos in range(len(events)):
        if pos in cpu_stream:
            if kept(events.index[pos]):
                chosen.append(pos)
        elif events.correlation[pos] in kept_correlations:
            chosen.append(pos)
    return chosen


def _kept_correlations(trace: Trace, events: DeviceEvents, keep: Callable[[int], bool]) -> set[int]:
    """Correlation ids carried by CPU spans that HTA keeps."""
    spans = trace.spans
    argrefs = spans["args"]
    found: set[int] = set()
    gpu = set(events.index) - {events.index[p] for p in events.cpu_stream_events}
    for correlation, first in events.cpu_correlation.items():
        if keep(first):
            found.add(correlation)
    if len(found) == len(events.cpu_correlation):
        return found
    # a correlation id carried by several CPU spans: kept when any of them is
    all_args = trace.args
    read_correlation = arg_reader(("correlation",))
    known = events.span_correlation
    if len(known) != len(spans):
        known = array("q", [-2]) * len(spans)
    refs, correlations = argrefs.tolist(), known.tolist()
    # a span whose correlation is known to be -1 (none, or not an integer) adds nothing
    for i in [i for i, c in enumerate(correlations) if c != -1]:
        ref, correlation = refs[i], correlations[i]
        if ref < 0 or i in gpu:
            continue
        if correlation == -2:
            (value,) = read_correlation(all_args[ref])
            correlation = -1 if value is None else _as_int(value)
        if correlation >= 0 and correlation not in found and keep(i):
            found.add(correlation)
    return found


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged intervals (touching ones merge, as HTA's ``merge_kernel_intervals``)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    return sum(end - start for start, end in merge_intervals(intervals))


def _type_name(state: int, bits: Sequence[tuple[str, int]]) -> str:
    return " overlapping ".join(name for name, bit in bits if state & bit)


def _kernel_type_times(
    merged_by_type: dict[str, list[tuple[int, int]]], with_memory: bool
) -> list[KernelTypeTime]:
    """``merged_by_type``: each type's ``merge_intervals``."""
    bits = [(name, bit) for name, bit in _TYPE_BITS if with_memory or name != MEMORY]
    edges: list[tuple[int, int]] = []
    for name, bit in bits:
        for start, end in merged_by_type.get(name, ()):
            edges.append((start, bit))
            edges.append((end, -bit))
    edges.sort()
    totals: dict[int, int] = {}
    state = 0
    for position, (time, delta) in enumerate(edges):
        state += delta
        if state > 0 and position + 1 < len(edges):
            totals[state] = totals.get(state, 0) + edges[position + 1][0] - time
    whole = sum(totals.values())
    rows = [
        KernelTypeTime(_type_name(s, bits), ns, 100.0 * ns / whole if whole else 0.0)
        for s, ns in totals.items()
        if ns > 0
    ]
    rows.sort(key=lambda r: -r.ns)
    return rows


def breakdown(
    events: DeviceEvents, positions: Sequence[int], device: str, scope: str
) -> DeviceBreakdown:
    """HTA's temporal and kernel-type breakdowns of the chosen device events."""
    intervals = [(events.start[p], events.end[p]) for p in positions]
    by_type: dict[str, list[tuple[int, int]]] = {}
    for p in positions:
        by_type.setdefault(events.kind[p], []).append((events.start[p], events.end[p]))
    merged = merge_intervals(intervals)
    span = merged[-1][1] - merged[0][0] if merged else 0
    busy = sum(end - start for start, end in merged)
    merged_by_type = {kind: merge_intervals(ivs) for kind, ivs in by_type.items()}
    compute = sum(end - start for start, end in merged_by_type.get(COMPUTATION, ()))
    idle = span - busy
    non_compute = span - compute - idle

    def pct(ns: int) -> float:
        return 100.0 * ns / span if span else 0.0

    streams: dict[tuple[str, int], list[int]] = {}
    for p in positions:
        streams.setdefault((events.device[p], events.stream[p]), []).append(p)
    stream_rows = []
    for (dev, stream), members in sorted(streams.items()):
        ivs = [(events.start[p], events.end[p]) for p in members]
        m = merge_intervals(ivs)
        s_span = m[-1][1] - m[0][0] if m else 0
        s_busy = sum(e - s for s, e in m)
        of_kind: dict[str, list[tuple[int, int]]] = {}
        for p in members:
            of_kind.setdefault(events.kind[p], []).append((events.start[p], events.end[p]))
        kinds = {
            kind: _union_ns(of_kind.get(kind, ()))
            for kind in (COMPUTATION, COMMUNICATION, MEMORY, OTHER)
        }
        stream_rows.append(
            StreamBreakdown(
                dev,
                stream,
                len(members),
                s_span,
                s_busy,
                s_span - s_busy,
                kinds[COMPUTATION],
                kinds[COMMUNICATION],
                kinds[MEMORY],
                kinds[OTHER],
            )
        )
    return DeviceBreakdown(
        device=device,
        scope=scope,
        events=len(positions),
        span_ns=span,
        idle_ns=idle,
        compute_ns=compute,
        non_compute_ns=non_compute,
        idle_pct=pct(idle),
        compute_pct=pct(compute),
        non_compute_pct=pct(non_compute),
        kernel_types=_kernel_type_times(merged_by_type, with_memory=True),
        kernel_types_no_memory=_kernel_type_times(merged_by_type, with_memory=False),
        streams=stream_rows,
    )


def device_breakdowns(
    events: DeviceEvents, positions: Sequence[int], scope: str
) -> list[DeviceBreakdown]:
    """One breakdown over every chosen event (``device == "all"``, HTA's per-rank numbers),
    then one per device when there are several."""
    if not positions:
        return []
    result = [breakdown(events, positions, "all", scope)]
    devices = sorted({events.device[p] for p in positions})
    if len(devices) > 1:
        for device in devices:
            chosen = [p for p in positions if events.device[p] == device]
            result.append(breakdown(events, chosen, device, scope))
    return result


@dataclass(frozen=True)
class PositionIndex:
    """Positions of device events sorted by start, with the running maximum of their ends:
    the events overlapping a window are one slice of ``order``."""

    order: list[int]
    starts: list[int]
    max_end: list[int]

    def overlapping(self, lo: int, hi: int) -> list[int]:
        """Every position whose event may overlap ``(lo, hi)`` (and a few that touch it)."""
        first = bisect_right(self.max_end, lo)  # before it every event ends at or before lo
        last = bisect_left(self.starts, hi)  # from it every event starts at or after hi
        return self.order[first:last]


def position_index(events: DeviceEvents, positions: Sequence[int]) -> PositionIndex:
    """Index ``positions`` by start time (see ``PositionIndex``)."""
    start, end = events.start, events.end
    order = sorted(positions, key=start.__getitem__)
    max_end: list[int] = []
    top: int | None = None
    for p in order:
        top = end[p] if top is None or end[p] > top else top
        max_end.append(top)
    return PositionIndex(order, [start[p] for p in order], max_end)


def step_device_categories(
    events: DeviceEvents,
    positions: Sequence[int],
    window: tuple[int, int],
    index: PositionIndex | None = None,
) -> list[Category]:
    """Device time within one step's wall time: exclusive slices that sum to the step.

    ``computation`` (a computation kernel runs), ``communication`` (communication, no
    computation), ``memory`` (only memcpy/memset), ``other`` (only sync events), ``idle``.
    ``index`` (``position_index`` of the same positions) finds the step's events faster.
    """
    lo, hi = window
    clipped: dict[str, list[tuple[int, int]]] = {}
    for p in positions if index is None else index.overlapping(lo, hi):
        s, e = max(events.start[p], lo), min(events.end[p], hi)
        if e > s:
            clipped.setdefault(events.kind[p], []).append((s, e))
    order = (COMPUTATION, COMMUNICATION, MEMORY, OTHER)
    taken: list[tuple[int, int]] = []
    result: list[Category] = []
    total = hi - lo
    before = 0  # the time ``taken`` covers (it is merged: its lengths add up)
    for kind in order:
        taken = merge_intervals(taken + clipped.get(kind, []))
        covered = sum(end - start for start, end in taken)
        ns = covered - before
        before = covered
        result.append(Category(kind.lower(), ns, 100.0 * ns / total if total else 0.0))
    idle = total - before
    result.append(Category("idle", idle, 100.0 * idle / total if total else 0.0))
    return result
