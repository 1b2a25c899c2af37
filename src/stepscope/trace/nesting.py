"""Span nesting per thread: each span's parent and self time (duration minus its children).

The C ``nest_spans`` (``_csrc/span_nesting.c``) does the work when the extension is in use;
``nest_spans_python`` is its pure-Python twin.
"""

from __future__ import annotations

import heapq
import re
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope._ext import native
from stepscope.trace.model import Trace

__all__ = ["DEVICE_CATEGORIES", "Nesting", "group_name", "nest_spans", "nest_spans_python"]

_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")

DEVICE_CATEGORIES = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_driver"}
)
"""Span categories that run on a device, not on the CPU thread that launched them."""


def group_name(name: str) -> str:
    """The name spans are grouped under: every ``ProfilerStep#N`` becomes ``ProfilerStep*``."""
    return "ProfilerStep*" if _STEP_NAME.match(name) else name


@dataclass(frozen=True)
class Nesting:
    """For every span index: its parent span index (-1 at the root) and its self time (ns).

    ``folded[i]`` is 1 when span i is the only child of a span with the same name (a dispatcher
    op wrapping its kernel, e.g. ``aten::mean`` inside ``aten::mean``).  Like torch's event
    tree, tables and stacks fold such a span into its parent: its self time counts for the
    parent and it is not counted as a call of its own.
    """

    parent: array[int]
    self_ns: array[int]
    folded: array[int]

    def ancestors(self, index: int) -> list[int]:
        """Indices of the enclosing spans, innermost first."""
        chain = []
        p = self.parent[index]
        while p >= 0:
            chain.append(p)
            p = self.parent[p]
        return chain


def nest_spans(trace: Trace) -> Nesting:
    """Compute parents and self times from span containment on each (pid, tid) track.

    A span's parent is the innermost span on the same track that contains its start (for a
    ``ProfilerStep#N``, the innermost that contains it whole: see ``_lift_crossing_steps``).
    Self time is the time during which a span is the innermost open span (the latest started one
    still running), so self times never overlap: on every track they add up to the time some
    span was open.  Spans that overlap without nesting (a step marker opened inside one call and
    closed inside a later one, clock skew between two recorders) are attributed that way too.

    Runs the C ``nest_spans`` (``_csrc/span_nesting.c``) when the extension is in use, else its
    twin :func:`nest_spans_python`; both give the same arrays.
    """
    mod = native()
    if mod is None:
        return nest_spans_python(trace)
    spans = trace.spans
    flags = bytearray(len(trace.strings))
    for sid in _step_name_ids(trace):
        flags[sid] = 1
    parent_bytes, self_bytes, folded_bytes = mod.nest_spans(
        spans["pid"], spans["tid"], spans["start_ns"], spans["dur_ns"], spans["name"], flags
    )
    parent, self_ns, folded = array("i"), array("q"), array("b")
    parent.frombytes(parent_bytes)
    self_ns.frombytes(self_bytes)
    folded.frombytes(folded_bytes)
    return Nesting(parent, self_ns, folded)


def nest_spans_python(trace: Trace) -> Nesting:
    """Twin of the C ``nest_spans``: the same parents, self times and fold flags in Python."""
    spans = trace.spans
    n = len(spans)
    # plain lists: indexing them hands back existing ints instead of making new ones
    pid, tid = spans["pid"].tolist(), spans["tid"].tolist()
    start, dur = spans["start_ns"].tolist(), spans["dur_ns"].tolist()
    parent = array("i", [-1]) * n
    self_ns = array("q", dur)
    # by (pid, tid, start, -dur, i), in one stable sort on an integer that orders like that
    # tuple: each column is an int64, so pid, tid, start and 2**63 - 1 - dur (in [0, 2**64))
    # each take 64 bits (tid and start signed: a lower field stays within its 64-bit band)
    top = (1 << 63) - 1
    keys = [
        (((p << 64) + t) << 128) + (s << 64) + (top - d)
        for p, t, s, d in zip(pid, tid, start, dur, strict=True)
    ]
    order = sorted(range(n), key=keys.__getitem__)
    del keys
    stack: list[int] = []
    stack_ends: list[int] = []  # the end of every span on the stack
    track_pid: int | None = None
    track_tid: int | None = None
    # A stretch of a track begins where a span starts with nothing open on the track (every
    # earlier span has ended): stretches never share time, so the sweep that crossing spans
    # need is run on the stretches that hold them, each on its own.
    stretch_begin = 0
    crossing = False  # some span in this stretch outlives its parent
    for position, i in enumerate(order):
        if pid[i] != track_pid or tid[i] != track_tid:
            stack.clear()
            stack_ends.clear()
            track_pid, track_tid = pid[i], tid[i]
        s = start[i]
        end = s + dur[i]
        while stack_ends and stack_ends[-1] <= s:
            stack.pop()
            stack_ends.pop()
        if stack:
            p = stack[-1]
            parent[i] = p
            p_end = stack_ends[-1]
            if end > p_end:
                crossing = True
                self_ns[p] -= p_end - s
            else:
                self_ns[p] -= end - s
        else:
            if crossing:
                _sweep_self_times(order[stretch_begin:position], start, dur, self_ns)
            stretch_begin, crossing = position, False
        stack.append(i)
        stack_ends.append(end)
    if crossing:
        _sweep_self_times(order[stretch_begin:], start, dur, self_ns)
    names = spans["name"].tolist()
    _lift_crossing_steps(trace, names, parent, start, dur)
    children = Counter(parent)  # span -> its number of children (and -1 -> the roots)
    folded = array("b", [0]) * n
    for i, p in enumerate(parent):
        if p >= 0 and children[p] == 1 and names[p] == names[i]:
            folded[i] = 1
    return Nesting(parent, self_ns, folded)


def _lift_crossing_steps(
    trace: Trace, names: list[int], parent: array[int], start: list[int], dur: list[int]
) -> None:
    """A step that outlives its parent hangs under the nearest ancestor that contains it whole.

    With steps ended from an optimizer hook, ``ProfilerStep#N`` opens inside step N-1's
    ``Optimizer.step`` and outlives it: a step belongs to no span that ends inside it, or the
    steps would stack up (step, Optimizer.step, step, ...) and inherit what they cross.
    """
    step_ids = _step_name_ids(trace)
    if not step_ids:
        return
    for i, name in enumerate(names):
        if name not in step_ids or parent[i] < 0:
            continue
        end = start[i] + dur[i]
        p = parent[i]
        while p >= 0 and start[p] + dur[p] < end:
            p = parent[p]
        parent[i] = p


def _step_name_ids(trace: Trace) -> set[int]:
    """The string ids of the trace's ``ProfilerStep#N`` names."""
    return {sid for sid, text in enumerate(trace.strings) if _STEP_NAME.match(text)}


_PAST_EVERY_END = 1 << 65
"""Later than any span's end (start + duration of two int64 columns)."""


def _sweep_self_times(
    track: list[int], start: Sequence[int], dur: Sequence[int], self_ns: array[int]
) -> None:
    """Self times of one track's spans (sorted by start) when some overlap without nesting.

    Walks the track's start and end times in order; each stretch of time goes to the latest
    started span still open.
    """
    for i in track:
        self_ns[i] = 0
    open_spans: list[int] = []  # in start order; the last one is the innermost
    ends: list[tuple[int, int]] = []  # heap of (end, span)
    heappop, heappush = heapq.heappop, heapq.heappush
    now = 0
    for i in (*track, -1):  # -1: past the last start, every span still open closes
        s = start[i] if i >= 0 else _PAST_EVERY_END
        while ends and ends[0][0] <= s:  # close the spans ending by s
            end, j = heappop(ends)
            self_ns[open_spans[-1]] += end - now
            now = end
            if open_spans[-1] == j:
                open_spans.pop()
            else:
                open_spans.remove(j)
        if i < 0:
            break
        if open_spans:
            self_ns[open_spans[-1]] += s - now
        now = s
        open_spans.append(i)
        heappush(ends, (s + dur[i], i))


def innermost_spans_at(
    trace: Trace, points: list[tuple[int, int, int]], outermost_of: str | None = None
) -> dict[tuple[int, int, int], int]:
    """For (pid, tid, time) points: the innermost span open on that track then (-1: none).

    "Innermost" is the latest started span still running, as in :func:`nest_spans`; a span
    covers its start up to, not including, its end.  With ``outermost_of`` (a category), the
    outermost open span of that category instead, where there is one (the op a program called,
    not the ops it called in turn).
    """
    spans = trace.spans
    pid, tid = spans["pid"], spans["tid"]
    start, dur = spans["start_ns"], spans["dur_ns"]
    by_track: dict[tuple[int, int], list[int]] = {}
    for i in range(len(spans)):
        by_track.setdefault((pid[i], tid[i]), []).append(i)
    found: dict[tuple[int, int, int], int] = {}
    for point in sorted(set(points)):
        found[point] = -1
    points_by_track: dict[tuple[int, int], list[int]] = {}
    for p, t, ts in found:
        points_by_track.setdefault((p, t), []).append(ts)
    for track, times in points_by_track.items():
        order = sorted(by_track.get(track, ()), key=lambda i: (start[i], -dur[i], i))
        open_spans: list[int] = []
        ends: list[tuple[int, int]] = []
        next_span = 0
        for ts in times:  # ascending
            while next_span < len(order) and start[order[next_span]] <= ts:
                i = order[next_span]
                open_spans.append(i)
                heapq.heappush(ends, (start[i] + dur[i], i))
                next_span += 1
            while ends and ends[0][0] <= ts:
                _, j = heapq.heappop(ends)
                open_spans.remove(j)
            if open_spans:
                found[(track[0], track[1], ts)] = _chosen(trace, open_spans, outermost_of)
    return found


def _chosen(trace: Trace, open_spans: list[int], outermost_of: str | None) -> int:
    """The innermost of the open spans (in start order), or the outermost of a category."""
    if outermost_of is not None:
        cats = trace.spans["cat"]
        for i in open_spans:
            if trace.string(cats[i]) == outermost_of:
                return i
    return open_spans[-1]
