"""Top tables: operators, kernels (with the operator that launched them), Python functions,
CPU-to-device launch delay, counters and dropped events.

Operators are host spans grouped by name (``ProfilerStep#N`` -> ``ProfilerStep*`` left out),
with self time from ``trace.nesting`` (a span folded into a same-named parent counts for the
parent, as in ``key_averages``).  A kernel's launching operator is the innermost enclosing
host span that is not a runtime call (``cuda_runtime``/``cuda_driver``) of the CPU span with the
kernel's ``correlation`` id.  Launch delay is the kernel's start minus that runtime call's start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from stepscope.analysis.device import DeviceEvents
from stepscope.analysis.result import (
    CounterInfo,
    FunctionRow,
    KernelRow,
    LaunchDelay,
    OperatorRow,
)
from stepscope.trace.model import Trace
from stepscope.trace.nesting import Nesting, group_name

__all__ = [
    "counters",
    "dropped_events",
    "functions",
    "kernels",
    "launch_delay",
    "operators",
    "sampler_notes",
]

_RUNTIME = frozenset({"cuda_runtime", "cuda_driver", "mtia_runtime"})
_NOT_OPERATORS = frozenset({"python_function", "Trace"})


def operators(
    trace: Trace,
    nesting: Nesting,
    self_ns: Sequence[int],
    members: Sequence[int],
    step_total_ns: int,
) -> list[OperatorRow]:
    """Host spans in ``members`` grouped by name, by self time (steps themselves left out)."""
    spans = trace.spans
    names, cats, durs = spans["name"].tolist(), spans["cat"].tolist(), spans["dur_ns"].tolist()
    strings = trace.strings
    left_out = {c for c in set(cats) if strings[c] in _NOT_OPERATORS}
    rows: dict[str, list[Any]] = {}
    grouped: dict[int, str] = {}  # name id -> group_name of it
    all_folded = nesting.folded
    for i in members:
        cat_id = cats[i]
        if cat_id in left_out:
            continue
        name_id = names[i]
        name = grouped.get(name_id)
        if name is None:
            name = grouped[name_id] = group_name(strings[name_id])
        if name == "ProfilerStep*":
            continue
        row = rows.get(name)
        if row is None:
            row = rows[name] = [strings[cat_id], 0, 0, 0]
        folded = all_folded[i]
        row[1] += 0 if folded else 1
        row[2] += self_ns[i]
        row[3] += 0 if folded else durs[i]
    out = [
        OperatorRow(name, cat, calls, s, total, 100.0 * s / step_total_ns if step_total_ns else 0.0)
        for name, (cat, calls, s, total) in rows.items()
    ]
    out.sort(key=lambda r: (-r.self_ns, r.name))
    return out


def functions(
    trace: Trace,
    nesting: Nesting,
    self_ns: Sequence[int],
    members: Sequence[int],
    sampled: dict[str, tuple[int, float, float]] | None = None,
) -> list[FunctionRow]:
    """Python functions: ``python_function`` spans, else sampled functions (name -> samples,
    self ns, total ns)."""
    spans = trace.spans
    names, cats, durs = spans["name"], spans["cat"], spans["dur_ns"]
    strings = trace.strings
    rows: dict[str, list[int]] = {}
    for i in members:
        if strings[cats[i]] != "python_function":
            continue
        row = rows.setdefault(strings[names[i]], [0, 0, 0])
        row[0] += 1
        row[1] += self_ns[i]
        # total time without double counting recursion: only the outermost call
        p, recursive = nesting.parent[i], False
        while p >= 0:
            if names[p] == names[i]:
                recursive = True
                break
            p = nesting.parent[p]
        row[2] += 0 if recursive else durs[i]
    out = [FunctionRow(n, c, s, t, False) for n, (c, s, t) in rows.items()]
    if not out and sampled:
        out = [
            FunctionRow(n, samples, round(s), round(t), True)
            for n, (samples, s, t) in sampled.items()
        ]
    out.sort(key=lambda r: (-r.self_ns, r.name))
    return out


def _launcher(trace: Trace, nesting: Nesting, span: int) -> str:
    cats, names = trace.spans["cat"], trace.spans["name"]
    strings = trace.strings
    p = nesting.parent[span]
    while p >= 0:
        if strings[cats[p]] not in _RUNTIME:
            return group_name(strings[names[p]])
        p = nesting.parent[p]
    return strings[names[span]]


def kernels(
    trace: Trace, nesting: Nesting, events: DeviceEvents, positions: Sequence[int]
) -> list[KernelRow]:
    """Device events grouped by name with their launching operators."""
    groups: dict[str, list[Any]] = {}
    durs = trace.spans["dur_ns"]
    launcher_of: dict[int, str] = {}
    for p in positions:
        name = events.name[p]
        row = groups.get(name)
        if row is None:
            row = groups[name] = [events.kind[p], 0, 0, 0, Counter()]
        d = durs[events.index[p]]
        row[1] += 1
        row[2] += d
        row[3] = max(row[3], d)
        cpu = events.cpu_correlation.get(events.correlation[p])
        if cpu is not None and events.correlation[p] >= 0:
            if cpu not in launcher_of:
                launcher_of[cpu] = _launcher(trace, nesting, cpu)
            row[4][launcher_of[cpu]] += 1
    out = [
        KernelRow(name, kind, calls, total, total / calls, mx, [n for n, _ in c.most_common(3)])
        for name, (kind, calls, total, mx, c) in groups.items()
    ]
    out.sort(key=lambda r: (-r.total_ns, r.name))
    return out


def launch_delays(trace: Trace, events: DeviceEvents, positions: Sequence[int]) -> list[int]:
    """Kernel start minus its runtime call's start, for every event with a known launch."""
    starts = trace.spans["start_ns"]
    out = []
    for p in positions:
        c = events.correlation[p]
        cpu = events.cpu_correlation.get(c) if c >= 0 else None
        if cpu is not None:
            out.append(events.raw_start[p] - starts[cpu])
    return out


def launch_delay(delays: Sequence[int]) -> LaunchDelay | None:
    """Statistics of launch delays (None without any)."""
    if not delays:
        return None
    d = sorted(delays)
    n = len(d)
    return LaunchDelay(n, sum(d) / n, d[n // 2], d[max(0, -(-95 * n // 100) - 1)], d[-1])


def counters(trace: Trace) -> list[CounterInfo]:
    """The counter tracks in the trace, with their range and last value."""
    found: dict[str, list[Any]] = {}
    for event in trace.iter_counter_events():
        row = found.setdefault(event.name, [set(), 0, float("inf"), float("-inf"), 0.0])
        row[0].update(event.values)
        row[1] += 1
        for v in event.values.values():
            row[2], row[3] = min(row[2], v), max(row[3], v)
        row[4] = next(iter(event.values.values()))
    return [
        CounterInfo(name, sorted(series), n, lo, hi, last)
        for name, (series, n, lo, hi, last) in sorted(found.items())
    ]


def sampler_notes(trace: Trace) -> list[str]:
    """What the trace metadata says stopped the sampler early or left threads out."""
    sampler = trace.metadata.get("stepscope_sampler")
    if not isinstance(sampler, dict):
        return []
    notes = []
    if sampler.get("sigprof_replaced_during_run"):
        notes.append(
            "the program installed its own SIGPROF handler during the window: the sampler "
            "stopped there, so later time has no samples"
        )
    if sampler.get("lost_threads_without_slot"):
        notes.append(
            f"{sampler['lost_threads_without_slot']} threads were not sampled: the signal "
            "sampler has slots for 256 threads"
        )
    return notes


def dropped_events(trace: Trace) -> dict[str, int]:
    """Events the recorders dropped and the reader skipped, from the trace metadata."""
    meta = trace.metadata
    out: dict[str, int] = {}
    tracer = meta.get("stepscope_python_tracer")
    if isinstance(tracer, dict) and tracer.get("dropped_events"):
        out["python_tracer_dropped_calls"] = int(tracer["dropped_events"])
    sampler = meta.get("stepscope_sampler")
    if isinstance(sampler, dict):
        for key, value in sampler.items():
            if key.startswith("lost") and isinstance(value, int) and value:
                out[f"sampler_{key}"] = value
    skipped = meta.get("stepscope_skipped_events")
    if isinstance(skipped, dict):
        for key, value in skipped.items():
            if isinstance(value, int) and value:
                out[f"reader_skipped_{key}"] = value
    elif isinstance(skipped, int) and skipped:
        out["reader_skipped"] = skipped
    annotations = meta.get("stepscope_annotations_dropped")
    if isinstance(annotations, int) and annotations:
        out["annotation_spans_dropped"] = annotations
    errors = meta.get("stepscope_collector_errors")
    if isinstance(errors, (list, dict)) and errors:
        out["collector_errors"] = len(errors)
    flight = meta.get("stepscope_flight")
    if isinstance(flight, dict):
        for key in ("spans_dropped", "samples_forgotten_early"):
            value = flight.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value:
                out[f"flight_{key}"] = value
    return out


def flight_notes(trace: Trace) -> list[str]:
    """Why a flight recorder dump was written, from its ``stepscope_flight`` metadata."""
    flight = trace.metadata.get("stepscope_flight")
    if not isinstance(flight, dict) or not isinstance(flight.get("reason"), str):
        return []
    first, last = flight.get("first_step"), flight.get("last_step")
    held = f" (steps {first}-{last})" if first is not None and last is not None else ""
    return [f"flight recorder dump{held}: {flight['reason']}: {flight.get('detail', '')}"]
