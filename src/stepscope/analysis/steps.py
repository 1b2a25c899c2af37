"""Steps: the ``ProfilerStep#N`` spans of a trace, or the whole trace as one step.

A step is a host span named ``ProfilerStep#N`` (not its device-side copy, category
``gpu_user_annotation``); a span stepscope closed at the window end
(``stepscope.open_at_window_end``) is a partial step and left out, and so is the last step of a
window stepscope marks cut short (``stepscope_window_complete: false``: the profile stopped
before that step's own ``step()``, e.g. the step ``profile.step()`` opened after the loop's last
iteration) when the window has other steps.  When one step number
appears on several threads, the longest span is the step.  A trace without steps is analysed
as one step spanning its host events, on the thread that was busy longest.
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
    "find_steps",
    "left_out_last_step",
    "parse_step_range",
    "select_steps",
    "step_stats",
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


def find_steps(trace: Trace, host: Sequence[bool] | None = None) -> tuple[list[StepWindow], bool]:
    """The steps of a trace, by start time; the flag says whether it had ``ProfilerStep`` spans."""
    spans = trace.spans
    host = host_span_mask(trace) if host is None else host
    names, argrefs = spans["name"], spans["args"]
    pids, tids, starts, durs = spans["pid"], spans["tid"], spans["start_ns"], spans["dur_ns"]
    step_ids: dict[int, int] = {}
    for sid, text in enumerate(trace.strings):
        m = _STEP.match(text)
        if m:
            step_ids[sid] = int(m.group(1))
    found: dict[int, StepWindow] = {}
    if step_ids:
        for i in range(len(spans)):
            number = step_ids.get(names[i])
            if number is None or not host[i] or durs[i] < 0:  # a negative span is no step
                continue
            args = trace.args_at(argrefs[i])
            if args and args.get("stepscope.open_at_window_end"):
                continue
            window = StepWindow(
                number,
                trace.strings[names[i]],
                i,
                pids[i],
                tids[i],
                starts[i],
                starts[i] + durs[i],
            )
            if number not in found or window.dur_ns > found[number].dur_ns:
                found[number] = window
    if found:
        ordered = sorted(found.values(), key=lambda w: (w.start_ns, w.step or 0))
        if len(ordered) > 1 and trace.metadata.get("stepscope_window_complete") is False:
            ordered.pop()
        return ordered, True
    busy: dict[tuple[int, int], int] = {}
    lo, hi = math.inf, -math.inf
    for i in range(len(spans)):
        if not host[i]:
            continue
        busy[(pids[i], tids[i])] = busy.get((pids[i], tids[i]), 0) + durs[i]
        lo, hi = min(lo, starts[i]), max(hi, starts[i] + durs[i])
    if not busy:
        return [], False
    pid, tid = max(busy, key=lambda k: busy[k])
    return [StepWindow(None, "whole trace", -1, pid, tid, int(lo), int(hi))], False


def left_out_last_step(trace: Trace, steps: Sequence[StepWindow]) -> bool:
    """Whether :func:`find_steps` left out the cut-short last step of this trace's window."""
    if trace.metadata.get("stepscope_window_complete") is not False or not steps:
        return False
    last = max((s.step for s in steps if s.step is not None), default=None)
    return last is not None and any(
        int(m.group(1)) > last for m in map(_STEP.match, trace.strings) if m is not None
    )


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
