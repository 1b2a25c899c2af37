"""Steps: the ``ProfilerStep#N`` spans of a trace, or the whole trace as one step.

A step is a host span named ``ProfilerStep#N`` (not its device-side copy, category
``gpu_user_annotation``).  A *cut-short* step is left out of the steps (and so of every
statistic, diff and straggler ranking) and listed by ``cut_short_steps``: a span stepscope closed
at the window end (``stepscope.open_at_window_end``), and the last step of a window stepscope
marks cut short (``stepscope_window_complete: false``: the profile stopped before that step's own
``step()`` — the step ``profile.step()`` opened after the loop's last iteration, a window flushed
at exit, a crash, a rank stopped early), even when it is the window's only step — unless that
is step 0, the one step of a profile that never called ``step()``.  When one
step number appears on several threads, the longest span is the step.  A trace without steps is
analysed as one step spanning its host events, on the thread that was busy longest.

``trace_steps`` finds all of it once per trace (``TraceSteps``); an analysis passes that to
each of its readers (breakdowns, memory, ranks) rather than each finding the steps again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.analysis.result import StepStats, StepTime
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES

__all__ = [
    "StepWindow",
    "TraceSteps",
    "cut_short_steps",
    "find_steps",
    "parse_step_range",
    "select_steps",
    "step_stats",
    "trace_steps",
]

_STEP = re.compile(r"^ProfilerStep#(\d{1,4000})$")  # int() refuses 4,300 digits and more
_NOT_HOST = DEVICE_CATEGORIES | {"gpu_user_annotation", "cuda_profiler_range", "Trace"}


@dataclass(frozen=True)
class StepWindow:
    """One step: number (None for a whole trace), span index (-1: none), track, times."""

    step: int | None
    name: str
    span: int
    pid: int
    tid: int
    start_ns: int
    end_ns: int

    @property
    def dur_ns(self) -> int:
        """Duration (ns)."""
        return self.end_ns - self.start_ns


def host_span_mask(trace: Trace) -> list[bool]:
    """True for spans that run on a host thread (not device events, not Kineto's session)."""
    cats = trace.spans["cat"]
    strings = trace.strings
    not_host = {i for i, s in enumerate(strings) if s in _NOT_HOST}
    return [c not in not_host for c in cats]


def _step_spans(trace: Trace, host: Sequence[bool]) -> tuple[list[StepWindow], list[StepWindow]]:
    """(complete steps, cut-short steps), each by start time."""
    spans = trace.spans
    names, argrefs = spans["name"], spans["args"]
    pids, tids, starts, durs = spans["pid"], spans["tid"], spans["start_ns"], spans["dur_ns"]
    step_ids: dict[int, int] = {}
    for sid, text in enumerate(trace.strings):
        m = _STEP.match(text)
        if m:
            step_ids[sid] = int(m.group(1))
    found: dict[int, StepWindow] = {}
    partial: dict[int, StepWindow] = {}
    if step_ids:
        for i in range(len(spans)):
            number = step_ids.get(names[i])
            if number is None or not host[i] or durs[i] < 0:  # a negative span is no step
                continue
            args = trace.args_at(argrefs[i])
            window = StepWindow(
                number,
                trace.strings[names[i]],
                i,
                pids[i],
                tids[i],
                starts[i],
                starts[i] + durs[i],
            )
            into = partial if args and args.get("stepscope.open_at_window_end") else found
            if number not in into or window.dur_ns > into[number].dur_ns:
                into[number] = window
    ordered = sorted(found.values(), key=lambda w: (w.start_ns, w.step or 0))
    cut = [w for n, w in partial.items() if n not in found]
    never_stepped = len(ordered) == 1 and ordered[0].step == 0  # ``with profile(): ...``
    if ordered and trace.metadata.get("stepscope_window_complete") is False and not never_stepped:
        last = ordered.pop()
        if not any(
            w.step is not None and last.step is not None and w.step > last.step for w in cut
        ):
            cut.append(last)
    cut.sort(key=lambda w: (w.start_ns, w.step or 0))
    return ordered, cut


@dataclass(frozen=True)
class TraceSteps:
    """A trace's steps, found once: what every reader of one analysis takes."""

    host: list[bool]
    """Which spans run on a host thread (:func:`host_span_mask`)."""
    complete: list[StepWindow]
    """The complete steps by start time (one whole-trace step when it has no step spans)."""
    cut_short: list[StepWindow]
    """The steps cut short, by start time (see the module docstring)."""
    has_steps: bool
    """Whether the trace had ``ProfilerStep`` spans."""


def trace_steps(trace: Trace) -> TraceSteps:
    """Every step of a trace, complete and cut short, found in one pass."""
    host = host_span_mask(trace)
    ordered, cut = _step_spans(trace, host)
    if ordered or cut:
        return TraceSteps(host, ordered, cut, True)
    return TraceSteps(host, _whole_trace(trace, host), [], False)


def cut_short_steps(trace: Trace) -> list[StepWindow]:
    """The steps of a trace that were cut short (see the module docstring), by start time."""
    return _step_spans(trace, host_span_mask(trace))[1]


def find_steps(trace: Trace) -> tuple[list[StepWindow], bool]:
    """The complete steps of a trace, by start time; the flag says whether it had
    ``ProfilerStep`` spans (a trace with none is one whole-trace step)."""
    found = trace_steps(trace)
    return found.complete, found.has_steps


def _whole_trace(trace: Trace, host: Sequence[bool]) -> list[StepWindow]:
    """The one step of a trace without step spans: its host events, on the busiest thread."""
    spans = trace.spans
    pids, tids, starts, durs = spans["pid"], spans["tid"], spans["start_ns"], spans["dur_ns"]
    busy: dict[tuple[int, int], int] = {}
    lo, hi = math.inf, -math.inf
    for i in range(len(spans)):
        if not host[i]:
            continue
        busy[(pids[i], tids[i])] = busy.get((pids[i], tids[i]), 0) + durs[i]
        lo, hi = min(lo, starts[i]), max(hi, starts[i] + durs[i])
    if not busy:
        return []
    pid, tid = max(busy, key=lambda k: busy[k])
    return [StepWindow(None, "whole trace", -1, pid, tid, int(lo), int(hi))]


def parse_step_range(text: str) -> tuple[int, int]:
    """``N-M`` or ``N`` as an inclusive range of step numbers."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise ValueError(f"--steps {text!r}: expected a step number N or a range N-M (e.g. 3-7)")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise ValueError(f"--steps {text!r}: the range ends before it starts")
    return first, last


def select_steps(
    steps: Sequence[StepWindow], step_range: tuple[int, int] | None
) -> list[StepWindow]:
    """The steps whose number is in ``step_range`` (all when None; a whole-trace step stays)."""
    if step_range is None:
        return list(steps)
    lo, hi = step_range
    return [s for s in steps if s.step is None or lo <= s.step <= hi]


def step_stats(steps: Sequence[StepTime]) -> StepStats:
    """Min, median, p95 (nearest rank), max, mean, and the three slowest steps."""
    if not steps:
        return StepStats(0, 0, 0, 0, 0, 0.0, [])
    durs = sorted(s.dur_ns for s in steps)
    n = len(durs)
    median = durs[n // 2] if n % 2 else (durs[n // 2 - 1] + durs[n // 2]) // 2
    p95 = durs[max(0, math.ceil(0.95 * n) - 1)]
    slowest = sorted(steps, key=lambda s: -s.dur_ns)[:3]
    return StepStats(n, durs[0], median, p95, durs[-1], sum(durs) / n, slowest)
