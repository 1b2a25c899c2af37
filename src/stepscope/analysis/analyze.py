"""``analyze``: one ``TraceSummary`` per trace and one for all of them, from the small modules.

Scope: the analysed steps are every complete ``ProfilerStep`` (or those in ``step_range``);
host tables count the host spans that start inside them, on any thread.  Device totals use
HTA's own selection when every step is analysed (``device.hta_selection`` with the last step
included: the kernels launched up to the end of the last step), else the device events
launched inside the chosen steps.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress

from stepscope.analysis import device as dev
from stepscope.analysis import host, ops, steps
from stepscope.analysis.flames import merge_flames, trace_flames
from stepscope.analysis.memory import combine_memory, memory_summary
from stepscope.analysis.overhead import pick_overhead, trace_overhead
from stepscope.analysis.ranks import RankFacts, rank_facts, reduce_ranks
from stepscope.analysis.result import (
    Category,
    CounterInfo,
    DeviceBreakdown,
    FlameStacks,
    FunctionRow,
    HostBreakdown,
    KernelRow,
    OperatorRow,
    Report,
    StepTime,
    TraceSummary,
)
from stepscope.analysis.rules import SHORT_KERNEL_NS, recommend, straggler_recommendations
from stepscope.analysis.sampled_time import sampled_time
from stepscope.steps import window_label
from stepscope.trace.model import Trace
from stepscope.trace.nesting import nest_spans

__all__ = [
    "ANALYSIS_ERRORS",
    "FileAnalysis",
    "analyze",
    "analyze_file",
    "analyze_trace",
    "combine",
]

ANALYSIS_ERRORS = (ArithmeticError, LookupError, TypeError, RecursionError, MemoryError)
"""What a trace with values no analysis expects can raise (a bug to fix, but one file only)."""


@dataclass
class _Facts:
    """Everything one trace contributes, before tables are cut to the top rows."""

    source: str
    has_steps: bool
    steps: list[StepTime]
    cut_short: list[StepTime]
    host_steps: list[HostBreakdown]
    devices: list[DeviceBreakdown]
    device_steps: dict[str, list[Category]]
    operators: list[OperatorRow]
    kernels: list[KernelRow]
    functions: list[FunctionRow]
    delays: list[int]
    counters: list[CounterInfo]
    dropped: dict[str, int]
    overhead_ns: int
    notes: list[str]
    sums: dict[str, float] = field(default_factory=dict)
    window: str = ""
    flames: FlameStacks | None = None


class _Windows:
    """Membership in a union of half-open windows ``[lo, hi)``, by bisection."""

    def __init__(self, windows: Sequence[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(w for w in windows if w[1] > w[0]):
            if merged and lo <= merged[-1][1]:
                if hi > merged[-1][1]:
                    merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        self.los = [lo for lo, _ in merged]
        self.his = [hi for _, hi in merged]

    def __contains__(self, t: int) -> bool:
        k = bisect_right(self.los, t) - 1
        return k >= 0 and t < self.his[k]

    def select(self, items: Iterable[int], times: Sequence[int]) -> list[int]:
        """The items whose time lies in a window (one compare per item for a single window)."""
        if len(self.los) == 1:
            lo, hi = self.los[0], self.his[0]
            return [i for i in items if lo <= times[i] < hi]
        los, his = self.los, self.his
        return [
            i for i in items if (k := bisect_right(los, times[i]) - 1) >= 0 and times[i] < his[k]
        ]


def _facts(
    trace: Trace,
    source: str,
    step_range: tuple[int, int] | None,
    in_trace: steps.TraceSteps,
    flames: bool = False,
) -> _Facts:
    is_host, all_steps, has_steps = in_trace.host, in_trace.complete, in_trace.has_steps
    chosen = steps.select_steps(all_steps, step_range)
    notes: list[str] = []
    if not has_steps:
        notes.append("no ProfilerStep spans: the whole trace is analysed as one step")
    cut = steps.select_steps(in_trace.cut_short, step_range)
    if cut:
        cut_numbers = ", ".join(str(s.step) for s in cut)
        notes.append(
            f"step {cut_numbers} was cut short (the profile stopped inside it: the program ended, "
            "crashed or was stopped): shown, but left out of every statistic"
        )
    notes += ops.sampler_notes(trace)
    optimizers = _optimizers_in_turn(trace)
    if len(optimizers) > 1:
        notes.append(
            f"steps end at every optimizer step and {len(optimizers)} optimizers "
            f"({', '.join(optimizers)}) step in turn: one iteration of the program is "
            f"{len(optimizers)} steps here, so step times and their statistics mix the "
            "optimizers' steps (outliers are judged against the same optimizer's steps); "
            "--step-on module:qualname (the function of one training iteration), or "
            "prof.step() once per iteration, gives one step per iteration"
        )
    if step_range is not None and has_steps:
        notes.append(f"steps {step_range[0]}-{step_range[1]}: {len(chosen)} of {len(all_steps)}")
        if not chosen:
            numbers = [s.step for s in all_steps]
            raise ValueError(
                f"{source}: no step in {step_range[0]}-{step_range[1]} "
                f"(the trace has steps {min(numbers)}-{max(numbers)})"  # type: ignore[type-var]
            )
    spans = trace.spans
    starts = spans["start_ns"]
    nesting = nest_spans(trace)
    self_ns = array("q", nesting.self_ns)
    strings = trace.strings
    cats = spans["cat"]
    python_spans = any(strings[c] == "python_function" for c in set(cats))
    python_taken: dict[int, int] = {}
    sampled_rows: dict[str, tuple[int, float, float]] = {}
    if len(trace.samples) and not python_spans:
        found = sampled_time(trace, array("q", self_ns))
        python_taken = dict(found.taken_from_spans)
        sampled_rows = {n: (f.samples, f.self_ns, f.total_ns) for n, f in found.functions.items()}
    first = chosen[0].start_ns if chosen else 0
    step_times = [StepTime(s.step, s.name, s.start_ns - first, s.dur_ns, source) for s in chosen]
    cut_times = [StepTime(s.step, s.name, s.start_ns - first, s.dur_ns, source) for s in cut]
    host_steps = host.host_breakdowns(trace, nesting, self_ns, is_host, chosen, python_taken)
    for i, taken in python_taken.items():
        self_ns[i] -= taken
    step_windows = [(s.start_ns, s.end_ns) for s in chosen]
    windows = _Windows(step_windows)
    if has_steps:
        members = windows.select(compress(range(len(spans)), is_host), starts)
    else:
        members = list(compress(range(len(spans)), is_host))
    stacks = (
        trace_flames(trace, nesting, members, step_windows if has_steps else None)
        if flames
        else None
    )
    step_total = sum(s.dur_ns for s in chosen)

    events = dev.device_events(trace)
    if step_range is None or not has_steps:
        positions = dev.hta_selection(trace, events, include_last_step=True)
        scope = "HTA's selection: launched up to the end of the last step"
    else:
        positions = []
        for p in range(len(events)):
            cpu = events.cpu_correlation.get(events.correlation[p])
            launched = starts[cpu] if cpu is not None and events.correlation[p] >= 0 else None
            when = launched if launched is not None else events.raw_start[p]
            if when in windows:
                positions.append(p)
        scope = f"launched in steps {step_range[0]}-{step_range[1]}"
    devices = dev.device_breakdowns(events, positions, scope)
    device_steps: dict[str, list[Category]] = {}
    loader_names = {i for i, text in enumerate(strings) if "DataLoader" in text}
    # torch names the iterator: ``_MultiProcessingDataLoaderIter`` loads in worker processes
    worker_names = {i for i in loader_names if "MultiProcessing" in strings[i]}
    sums: dict[str, float] = {
        "step_ns": float(step_total),
        "steps": float(len(chosen)),
        "dataloader_spans": float(sum(1 for i in members if spans["name"][i] in loader_names)),
        "dataloader_worker_spans": float(
            sum(1 for i in members if spans["name"][i] in worker_names)
        ),
    }
    if positions:
        idle = 0
        index = dev.position_index(events, positions)
        for s in chosen:
            cats_ = dev.step_device_categories(events, positions, (s.start_ns, s.end_ns), index)
            device_steps[str(s.step) if s.step is not None else "all"] = cats_
            idle += cats_[-1].ns
        sums["device_idle_ns"] = float(idle)
        wait, gaps = _launch_gaps(trace, events, positions)
        sums["host_wait_ns"], sums["device_gap_ns"] = float(wait), float(gaps)
        durs = spans["dur_ns"]
        sums["device_events"] = float(len(positions))
        sums["short_device_events"] = float(
            sum(1 for p in positions if durs[events.index[p]] < SHORT_KERNEL_NS)
        )
        pageable = [
            p for p in positions if "Pageable" in events.name[p] and "HtoD" in events.name[p]
        ]
        sums["pageable_h2d_count"] = float(len(pageable))
        sums["pageable_h2d_ns"] = float(sum(durs[events.index[p]] for p in pageable))
    sums["step_optimizers"] = float(len(optimizers))
    sums["python_named"] = 1.0 if python_spans or len(trace.samples) else 0.0
    overhead_cats = {c for c, text in enumerate(strings) if text in ("overhead", "Overhead")}
    durations = spans["dur_ns"]
    overhead = sum(durations[i] for i in range(len(spans)) if cats[i] in overhead_cats)
    return _Facts(
        source=source,
        has_steps=has_steps,
        steps=step_times,
        cut_short=cut_times,
        host_steps=host_steps,
        devices=devices,
        device_steps=device_steps,
        operators=ops.operators(trace, nesting, self_ns, members, step_total),
        kernels=ops.kernels(trace, nesting, events, positions),
        functions=ops.functions(trace, nesting, self_ns, members, sampled_rows),
        delays=ops.launch_delays(trace, events, positions),
        counters=ops.counters(trace),
        dropped=ops.dropped_events(trace),
        overhead_ns=overhead,
        notes=notes,
        sums=sums,
        window=_window_name(trace),
        flames=stacks,
    )


def _optimizers_in_turn(trace: Trace) -> list[str]:
    """The optimizers whose steps ended steps (``stepscope_step_source``), when there are any."""
    source = trace.metadata.get("stepscope_step_source")
    found = source.get("optimizers") if isinstance(source, dict) else None
    return [str(name) for name in found] if isinstance(found, list) else []


def _window_name(trace: Trace) -> str:
    """The window's name from stepscope's ``stepscope_window`` metadata ("" without it)."""
    window = trace.metadata.get("stepscope_window")
    if not isinstance(window, dict):
        return ""
    index, first, end = (window.get(k) for k in ("index", "first_step", "last_step"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, first, end)):
        return ""
    return window_label(index, first, end)  # type: ignore[arg-type]


def _launch_gaps(
    trace: Trace, events: dev.DeviceEvents, positions: Sequence[int]
) -> tuple[int, int]:
    """Idle gaps between consecutive events of each stream, and the part of them spent
    waiting for the host: the next event's launch call began after the previous one ended."""
    starts = trace.spans["start_ns"]
    by_stream: dict[tuple[str, int], list[int]] = {}
    for p in positions:
        by_stream.setdefault((events.device[p], events.stream[p]), []).append(p)
    wait = gaps = 0
    for members in by_stream.values():
        members.sort(key=lambda p: events.start[p])
        prev_end: int | None = None
        for p in members:
            if prev_end is not None and events.start[p] > prev_end:
                gap = events.start[p] - prev_end
                gaps += gap
                cpu = events.cpu_correlation.get(events.correlation[p])
                if cpu is not None and events.correlation[p] >= 0 and starts[cpu] > prev_end:
                    wait += gap
            prev_end = events.end[p] if prev_end is None else max(prev_end, events.end[p])
    return wait, gaps


def _merge_operators(groups: Sequence[list[OperatorRow]], step_total: int) -> list[OperatorRow]:
    rows: dict[str, OperatorRow] = {}
    for group in groups:
        for r in group:
            old = rows.get(r.name)
            rows[r.name] = (
                r
                if old is None
                else replace(
                    old,
                    calls=old.calls + r.calls,
                    self_ns=old.self_ns + r.self_ns,
                    total_ns=old.total_ns + r.total_ns,
                )
            )
    out = [
        replace(r, self_pct=100.0 * r.self_ns / step_total if step_total else 0.0)
        for r in rows.values()
    ]
    out.sort(key=lambda r: (-r.self_ns, r.name))
    return out


def _merge_kernels(groups: Sequence[list[KernelRow]]) -> list[KernelRow]:
    rows: dict[str, KernelRow] = {}
    launchers: dict[str, Counter[str]] = {}
    for group in groups:
        for r in group:
            c = launchers.setdefault(r.name, Counter())
            c.update({name: r.calls for name in r.launched_by})
            old = rows.get(r.name)
            if old is None:
                rows[r.name] = r
            else:
                calls, total = old.calls + r.calls, old.total_ns + r.total_ns
                rows[r.name] = replace(
                    old,
                    calls=calls,
                    total_ns=total,
                    mean_ns=total / calls,
                    max_ns=max(old.max_ns, r.max_ns),
                )
    out = [
        replace(r, launched_by=[n for n, _ in launchers[r.name].most_common(3)])
        for r in rows.values()
    ]
    out.sort(key=lambda r: (-r.total_ns, r.name))
    return out


def _merge_functions(groups: Sequence[list[FunctionRow]]) -> list[FunctionRow]:
    rows: dict[tuple[str, bool], FunctionRow] = {}
    for group in groups:
        for r in group:
            old = rows.get((r.name, r.sampled))
            rows[(r.name, r.sampled)] = (
                r
                if old is None
                else replace(
                    old,
                    calls=old.calls + r.calls,
                    self_ns=old.self_ns + r.self_ns,
                    total_ns=old.total_ns + r.total_ns,
                )
            )
    out = list(rows.values())
    out.sort(key=lambda r: (-r.self_ns, r.name))
    return out


def _summarize(source: str, facts: Sequence[_Facts], top: int) -> TraceSummary:
    several = len(facts) > 1
    step_list = [s for f in facts for s in f.steps]
    host_steps = [b for f in facts for b in f.host_steps]
    sums: dict[str, float] = {}
    for f in facts:
        for k, v in f.sums.items():
            sums[k] = sums.get(k, 0.0) + v
    devices = [
        replace(d, device=f"{f.source}:{d.device}") if several else d
        for f in facts
        for d in f.devices
    ]
    device_steps = {
        (f"{f.source}:{k}" if several else k): v for f in facts for k, v in f.device_steps.items()
    }
    step_total = int(sums.get("step_ns", 0))
    measures: dict[str, float] = {
        "dataloader_spans": sums.get("dataloader_spans", 0.0),
        "dataloader_worker_spans": sums.get("dataloader_worker_spans", 0.0),
        "step_optimizers": max(f.sums.get("step_optimizers", 0.0) for f in facts),
        "python_named": min(f.sums.get("python_named", 0.0) for f in facts),
    }
    if "device_idle_ns" in sums and step_total:
        measures["device_idle_pct"] = 100.0 * sums["device_idle_ns"] / step_total
        measures["host_wait_ns"] = sums["host_wait_ns"]
        measures["device_gap_ns"] = sums["device_gap_ns"]
        n_steps = max(1.0, sums.get("steps", 1.0))
        measures["device_events_per_step"] = sums["device_events"] / n_steps
        if sums["device_events"]:
            measures["short_device_events_pct"] = (
                100.0 * sums["short_device_events"] / sums["device_events"]
            )
        measures["pageable_h2d_count"] = sums["pageable_h2d_count"]
        measures["pageable_h2d_ns"] = sums["pageable_h2d_ns"]
    dropped: dict[str, int] = {}
    for f in facts:
        for k, v in f.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
    notes = list(dict.fromkeys(n for f in facts for n in f.notes))
    if devices:
        notes.append(f"device totals: {devices[0].scope}")
    summary = TraceSummary(
        source=source,
        files=[f.source for f in facts],
        has_steps=all(f.has_steps for f in facts),
        steps=step_list,
        cut_short=[s for f in facts for s in f.cut_short],
        step_stats=steps.step_stats(step_list),
        host_total=host.total_breakdown(host_steps),
        host_steps=host_steps,
        devices=devices,
        device_steps=device_steps,
        operators=_merge_operators([f.operators for f in facts], step_total)[:top],
        kernels=_merge_kernels([f.kernels for f in facts])[:top],
        functions=_merge_functions([f.functions for f in facts])[:top],
        launch_delay=ops.launch_delay([d for f in facts for d in f.delays]),
        counters=[c for f in facts for c in f.counters],
        dropped=dropped,
        profiler_overhead_ns=sum(f.overhead_ns for f in facts),
        notes=notes,
        measures=measures,
        windows={f.source: f.window for f in facts if f.window},
        flames=merge_flames([f.flames for f in facts]),
    )
    return summary


def analyze_trace(
    trace: Trace, source: str = "trace", step_range: tuple[int, int] | None = None, top: int = 10
) -> TraceSummary:
    """Analyse one trace."""
    return analyze_file(source, trace, step_range, top, with_ranks=False).summary


def analyze(
    traces: Sequence[tuple[str, Trace]],
    step_range: tuple[int, int] | None = None,
    top: int = 10,
    failures: list[str] | None = None,
    *,
    flames: bool = False,
) -> Report:
    """Analyse traces (label, trace): a summary per trace and one of all of them together.

    With a ``failures`` list, a trace whose analysis fails is left out and a line saying why is
    appended (the others are still reported); without one, the error is raised.  ``flames``
    keeps each summary's flame-graph stacks (``TraceSummary.flames``, for the HTML report).
    """
    if not traces:
        raise ValueError("analyze: no traces given")
    if top < 1:
        raise ValueError(f"top must be 1 or more, got {top}")
    several = len(traces) > 1
    parts: list[FileAnalysis] = []
    for label, trace in traces:
        try:
            parts.append(analyze_file(label, trace, step_range, top, several, flames=flames))
        except ANALYSIS_ERRORS as exc:
            if failures is None:
                raise
            failures.append(f"{label}: cannot analyse: {type(exc).__name__}: {exc}")
    if not parts:
        raise ValueError(f"no trace could be analysed: {(failures or ['?'])[0]}")
    return combine(parts)


@dataclass
class FileAnalysis:
    """One file's part of a report (the map step): small, so a worker process can return it."""

    facts: _Facts
    summary: TraceSummary
    ranks: RankFacts | None
    step_range: tuple[int, int] | None
    top: int


def analyze_file(
    label: str,
    trace: Trace,
    step_range: tuple[int, int] | None = None,
    top: int = 10,
    with_ranks: bool = True,
    *,
    flames: bool = False,
) -> FileAnalysis:
    """Analyse one trace of a report (``flames``: keep its flame-graph stacks); ``combine``
    joins the files' parts."""
    if top < 1:
        raise ValueError(f"top must be 1 or more, got {top}")
    found = steps.trace_steps(trace)  # once: the breakdowns, memory and ranks all take them
    facts = _facts(trace, label, step_range, found, flames)
    summary = _summarize(facts.source, [facts], top)
    summary.memory = memory_summary(trace, top, step_range, found.complete)
    summary.overhead = trace_overhead(trace)
    summary.recommendations = recommend(summary)
    ranks = rank_facts(label, trace, step_range, found) if with_ranks else None
    return FileAnalysis(facts, summary, ranks, step_range, top)


def combine(parts: Sequence[FileAnalysis]) -> Report:
    """The report of several files from their parts, in file order (the reduce step)."""
    if not parts:
        raise ValueError("analyze: no traces given")
    step_range, top = parts[0].step_range, parts[0].top
    per_file = [p.summary for p in parts]
    facts = [p.facts for p in parts]
    combined = per_file[0] if len(facts) == 1 else _summarize("all files", facts, top)
    if len(facts) > 1:
        combined.memory = combine_memory([s.memory for s in per_file])
        combined.overhead = pick_overhead(per_file)
        combined.recommendations = recommend(combined)
    rank_parts = [p.ranks for p in parts if p.ranks is not None]
    ranks = reduce_ranks(rank_parts, per_file) if len(parts) > 1 else None
    if ranks is not None:
        combined.recommendations = straggler_recommendations(ranks) + combined.recommendations
    return Report(per_file, combined, step_range, top, ranks)
