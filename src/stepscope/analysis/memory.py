"""Memory per step, what was alive at the peak, and the leak hint, from a ``Trace``.

Two sources meet here: the Python heap, measured by stepscope's memory collector and kept in the
trace metadata under ``stepscope_memory``, and torch's tensor allocator, whose ``[memory]``
instants (``Bytes``, ``Total Allocated``, ``Device Type``, ``Device Id``) any trace recorded with
``profile_memory=True`` holds — stepscope's own or torch's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import pairwise
from statistics import median
from typing import Any

from stepscope.analysis.memory_types import LeakHint, LeakSite, MemoryStep, MemorySummary, PeakRow
from stepscope.analysis.steps import StepWindow, find_steps
from stepscope.trace.memory_fields import (
    MEMORY_INSTANT,
    MEMORY_KEY,
    PYTHON_HEAP_TRACK,
    RSS_TRACK,
    StepMemoryRow,
    TensorEvent,
    step_rows,
    tensor_events,
    thin_points,
)
from stepscope.trace.model import Trace

__all__ = [
    "LeakHint",
    "LeakSite",
    "MemoryStep",
    "MemorySummary",
    "PeakRow",
    "combine_memory",
    "memory_summary",
    "steady_rise",
    "tensor_steps",
]

LEAK_MIN_BYTES_PER_STEP = 4096
"""A rise smaller than this per step is noise (interpreter caches, free lists), not a leak."""
LEAK_MIN_STEPS = 4
"""Step ends a steady rise needs before it is a leak hint."""
SMALL_LEAK_BYTES_PER_STEP = 64 << 10
SMALL_LEAK_MIN_STEPS = 8
"""Step ends a rise below ``SMALL_LEAK_BYTES_PER_STEP`` needs: lazily built state grows by a few
KiB a step for a few steps (an HF Trainer on a GPU: 3.5, 4.1, 4.1, then 0.6 KiB)."""
RSS_RISE_MIN_BYTES_PER_STEP = 1 << 20
"""RSS moves by pages and allocator arenas: a rise below this per step is not reported."""


def tensor_steps(
    events: Sequence[TensorEvent], bounds: Sequence[tuple[int, int, int]]
) -> dict[int, tuple[dict[str, int], dict[str, int]]]:
    """Per step ``(step, start, end)``: tensor bytes held at its end and at most, by device."""
    result: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
    held: dict[str, int] = {}
    i = 0
    for step, start, end in sorted(bounds, key=lambda b: b[1]):
        while i < len(events) and events[i].ts_ns < start:
            held[events[i].device] = events[i].total_allocated
            i += 1
        peak = dict(held)
        while i < len(events) and events[i].ts_ns < end:
            e = events[i]
            held[e.device] = e.total_allocated
            peak[e.device] = max(peak.get(e.device, 0), e.total_allocated)
            i += 1
        result[step] = (dict(held), peak)
    return result


def steady_rise(values: Sequence[int], min_bytes: int = LEAK_MIN_BYTES_PER_STEP) -> int | None:
    """The median rise per step when step-end values rise steadily, else None.

    Needs four step ends (eight when the rise is under 64 KiB a step); with five or more the
    first rise (warm-up: caches, lazily built state) is left out.  Steady: at least three
    quarters of the rises are positive, the median rise is at least ``min_bytes`` and the whole
    window rose by at least half of it per step.
    """
    if len(values) < LEAK_MIN_STEPS:
        return None
    rises = [b - a for a, b in pairwise(values)]
    if len(rises) >= 4:
        rises = rises[1:]
    positive = sum(1 for r in rises if r > 0)
    typical = int(median(rises))
    if positive * 4 < len(rises) * 3 or typical < min_bytes:
        return None
    if sum(rises) < typical * len(rises) / 2:
        return None
    if typical < SMALL_LEAK_BYTES_PER_STEP and len(values) < SMALL_LEAK_MIN_STEPS:
        return None
    return typical


def rss_rise_note(per_step: int, steps: int) -> str:
    """The note for a steady RSS rise that neither the Python heap nor tensors explain."""
    return (
        f"the process RSS rose by about {per_step / 1048576:.1f} MiB per step over {steps} "
        "steps while the traced Python heap and tensors held steady: native memory "
        "(C extensions, allocator caches or fragmentation), not necessarily a leak"
    )


def _step_bounds(windows: Sequence[StepWindow]) -> list[tuple[int, int, int]]:
    return [(w.step if w.step is not None else 0, w.start_ns, w.end_ns) for w in windows]


def _memory_instants(trace: Trace) -> list[TensorEvent]:
    t = trace.instants
    if MEMORY_INSTANT not in trace.strings:
        return []
    wanted = trace.strings.index(MEMORY_INSTANT)
    names, pid, tid, ts, args = t["name"], t["pid"], t["tid"], t["ts_ns"], t["args"]
    return tensor_events(
        (ts[i], pid[i], tid[i], trace.args_at(args[i]))
        for i in range(len(names))
        if names[i] == wanted
    )


OP_CATEGORY = "cpu_op"
"""torch's operators: a tensor is named by the outermost one open at its allocation (the op the
program called, ``aten::zeros``, not the ``aten::empty`` it called in turn)."""


def _tensor_peak_table(
    trace: Trace, events: Sequence[TensorEvent], device: str, top: int
) -> tuple[int, list[PeakRow]]:
    """Tensors alive at the device's highest ``Total Allocated``, by allocating operator."""
    from stepscope.trace.nesting import innermost_spans_at

    mine = [e for e in events if e.device == device]
    if not mine:
        return 0, []
    peak_index = max(range(len(mine)), key=lambda k: mine[k].total_allocated)
    live: dict[int, TensorEvent] = {}
    for e in mine[: peak_index + 1]:
        if e.bytes > 0:
            live[e.addr] = e
        else:
            live.pop(e.addr, None)
    points = [(e.pid, e.tid, e.ts_ns) for e in live.values()]
    spans = innermost_spans_at(trace, points, outermost_of=OP_CATEGORY)
    groups: dict[str, list[int]] = {}
    for e, point in zip(live.values(), points, strict=True):
        index = spans.get(point, -1)
        name = trace.string(trace.spans["name"][index]) if index >= 0 else "(outside any op)"
        groups.setdefault(name, []).append(e.bytes)
    rows = [PeakRow(device, name, "", 0, sum(b), len(b)) for name, b in groups.items()]
    rows.sort(key=lambda r: -r.bytes)
    rows = rows[:top]
    total = mine[peak_index].total_allocated
    before = total - sum(e.bytes for e in live.values())
    if before > 0:  # torch's total counts tensors allocated before the window too
        rows.append(PeakRow(device, "(allocated before the window)", "", 0, before, 0))
    return total, rows


def _tensor_growth(
    trace: Trace,
    events: Sequence[TensorEvent],
    device: str,
    bounds: Sequence[tuple[int, int, int]],
    top: int = 10,
) -> list[LeakSite]:
    """Tensors still alive at the window's last step end that were allocated after the first
    step (past warm-up), by the operator that allocated them: what grew."""
    from stepscope.trace.nesting import innermost_spans_at

    if len(bounds) < 2:
        return []
    ordered = sorted(bounds, key=lambda b: b[1])
    after, until = ordered[0][2], ordered[-1][2]
    live: dict[int, TensorEvent] = {}
    for e in events:
        if e.device != device or e.ts_ns >= until:
            continue
        if e.bytes > 0:
            live[e.addr] = e
        else:
            live.pop(e.addr, None)
    grown = [e for e in live.values() if e.ts_ns >= after]
    points = [(e.pid, e.tid, e.ts_ns) for e in grown]
    spans = innermost_spans_at(trace, points, outermost_of=OP_CATEGORY)
    by_op: dict[str, int] = {}
    for e, point in zip(grown, points, strict=True):
        index = spans.get(point, -1)
        name = trace.string(trace.spans["name"][index]) if index >= 0 else "(outside any op)"
        by_op[name] = by_op.get(name, 0) + e.bytes
    ranked = sorted(by_op.items(), key=lambda item: -item[1])[:top]
    return [LeakSite(name, "", 0, size) for name, size in ranked]


def cuda_allocator_notes(steps: Sequence[MemoryStep]) -> list[str]:
    """What the CUDA caching allocator's counters say that the tensor figures do not: retries
    (it freed its cache to fit an allocation: memory near full or fragmented) and OOMs."""
    rows = [s.cuda_allocator for s in steps if s.cuda_allocator]
    if not rows:
        return []
    notes = []
    for key, what in (
        (
            "alloc_retries",
            "allocation(s) retried after freeing the allocator's cache (memory "
            "near full or fragmented: torch.cuda.memory_summary() shows where)",
        ),
        ("ooms", "out-of-memory error(s) raised by the CUDA allocator"),
    ):
        last, first = rows[-1].get(key, 0), rows[0].get(key, 0)
        if last > 0:
            during = f", {last - first} after the first recorded step" if len(rows) > 1 else ""
            notes.append(f"CUDA: {last:,} {what} in this process{during}")
    return notes


def _leak_sites(rows: Any) -> list[LeakSite]:
    sites = []
    for row in rows or ():
        if isinstance(row, Mapping):
            sites.append(
                LeakSite(
                    str(row.get("function", "")),
                    str(row.get("file", "")),
                    int(row.get("line", 0)),
                    int(row.get("growth_bytes", 0)),
                )
            )
    return sites


def _timeline(trace: Trace, events: Sequence[TensorEvent]) -> dict[str, list[tuple[int, int]]]:
    series: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        series.setdefault(f"tensors {e.device}", []).append((e.ts_ns, e.total_allocated))
    for name, track in (("python heap", PYTHON_HEAP_TRACK), ("rss", RSS_TRACK)):
        points = _counter_points(trace, track)
        if points:
            series[name] = points
    return {name: thin_points(points) for name, points in series.items()}


def _counter_points(trace: Trace, track: str) -> list[tuple[int, int]]:
    """(time, value) of a counter track, in the trace's own time base (as its events)."""
    name_id = trace.strings.index(track) if track in trace.strings else None
    if name_id is None:
        return []
    t = trace.counters
    points = [
        (ts, int(value))
        for name, ts, value in zip(t["name"], t["ts_ns"], t["value"], strict=True)
        if name == name_id
    ]
    points.sort()
    return points


def memory_summary(
    trace: Trace,
    top: int = 15,
    step_range: tuple[int, int] | None = None,
    windows: Sequence[StepWindow] | None = None,
) -> MemorySummary | None:
    """The memory section of one trace (steps in ``step_range``; ``windows``: its complete
    steps, when the caller has found them), None without memory data."""
    raw_meta = trace.metadata.get(MEMORY_KEY)
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    events = _memory_instants(trace)
    if not meta and not events:
        return None
    python = {row.step: row for row in step_rows(meta)}  # a step written twice: the last row
    bounds = _step_bounds(find_steps(trace)[0] if windows is None else windows)
    tensors = tensor_steps(events, bounds)
    numbers = sorted(set(python) | set(tensors))
    if step_range is not None:
        numbers = [n for n in numbers if step_range[0] <= n <= step_range[1]]
    steps = []
    for n in numbers:
        row = python.get(n) or StepMemoryRow(n, 0, 0)
        held, peak = tensors.get(n, ({}, {}))
        steps.append(
            MemoryStep(
                n,
                row.python_current,
                row.python_peak,
                row.rss,
                held,
                peak,
                dict(row.cuda_allocator),
            )
        )
    leaks: list[LeakHint] = []
    heap_ends = [s.python_current for s in steps if s.python_current is not None]
    rise = steady_rise(heap_ends)
    if rise is not None:  # the sites that grew come from the recorder's step-end snapshots
        leaks.append(LeakHint("python", rise, len(heap_ends), _leak_sites(meta.get("growth"))))
    devices = sorted({e.device for e in events})
    for device in devices:
        ends = [s.tensor_current[device] for s in steps if device in s.tensor_current]
        rise = steady_rise(ends)
        if rise is not None:
            leaks.append(LeakHint(device, rise, len(ends)))
    leaks = [
        replace(h, sites=_tensor_growth(trace, events, h.kind, bounds))
        if h.kind != "python" and not h.sites
        else h
        for h in leaks
    ]
    notes = [str(n) for n in meta.get("notes", ())]
    notes += cuda_allocator_notes(steps)
    if not leaks:  # neither the heap nor tensors rose: say so if the process did anyway
        rss_ends = [s.rss for s in steps if s.rss is not None]
        rise = steady_rise(rss_ends, RSS_RISE_MIN_BYTES_PER_STEP)
        if rise is not None:
            notes.append(rss_rise_note(rise, len(rss_ends)))
    judged = len(steps) >= LEAK_MIN_STEPS
    if not judged and steps:
        notes.append(
            f"{len(steps)} recorded step(s): a leak hint needs {LEAK_MIN_STEPS} step ends in one "
            f"window (a schedule with active={LEAK_MIN_STEPS} or more)"
        )
    peak_kind, peak_step, peak_bytes, table = _peak(trace, meta, events, devices, steps, top)
    timeline = _timeline(trace, events)
    return MemorySummary(
        steps, peak_kind, peak_step, peak_bytes, table, leaks, timeline, notes, judged
    )


def combine_memory(summaries: Sequence[MemorySummary | None]) -> MemorySummary | None:
    """The memory section of several traces together: every step's row (when no step number
    repeats, as across the windows of one run), the highest peak with its table, every leak
    hint; None when no trace has memory data."""
    found = [m for m in summaries if m is not None]
    if not found:
        return None
    rows = [row for m in found for row in m.steps]
    notes = list(dict.fromkeys(n for m in found for n in m.notes))
    if len({row.step for row in rows}) < len(rows):
        rows = []
        notes.append("memory per step: the files share step numbers (ranks): see each file")
    rows.sort(key=lambda row: row.step)
    top = max(found, key=lambda m: m.peak_bytes)
    leaks = [leak for m in found for leak in m.leaks]
    notes.append("the memory timeline is per file")
    judged = any(m.leak_judged for m in found)
    return MemorySummary(
        rows, top.peak_kind, top.peak_step, top.peak_bytes, top.peak_table, leaks, {}, notes, judged
    )


def _peak(
    trace: Trace,
    meta: Mapping[str, Any],
    events: Sequence[TensorEvent],
    devices: Sequence[str],
    steps: Sequence[MemoryStep],
    top: int,
) -> tuple[str | None, int | None, int, list[PeakRow]]:
    """The peak table: the kind of memory with the highest peak, and what held it."""
    best: tuple[str | None, int | None, int, list[PeakRow]] = (None, None, 0, [])
    peak = meta.get("peak")
    if isinstance(peak, Mapping) and int(peak.get("bytes", 0)) > 0:
        rows = [
            PeakRow(
                "python",
                str(r["function"]),
                str(r["file"]),
                int(r["line"]),
                int(r["bytes"]),
                int(r["count"]),
            )
            for r in peak.get("table", ())
            if isinstance(r, Mapping)
        ]
        best = ("python", peak.get("step"), int(peak["bytes"]), rows[:top])
    for device in devices:
        total, rows = _tensor_peak_table(trace, events, device, top)
        if total > best[2]:
            step = max(steps, key=lambda s: s.tensor_peak.get(device, -1), default=None)
            best = (device, step.step if step is not None else None, total, rows)
    return best
