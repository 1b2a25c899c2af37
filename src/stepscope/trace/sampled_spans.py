"""Stack samples as a sampled flame chart: nested spans per thread, for timeline viewers.

Perfetto's JSON importer reads only ``traceEvents`` (it skips the top-level ``stackFrames`` and
``samples`` keys), so a Chrome file shows samples in Perfetto only as events.  Each sample is
taken to last until the thread's next sample; consecutive samples that share a prefix of
functions extend the same spans, so a function that stayed on the stack is one span.  Spans go
to a separate track per sampled thread (``SAMPLED_TID_BASE + tid``) because they cannot nest
with the thread's own spans.  Idle samples end in an ``[idle]`` frame.
"""

from __future__ import annotations

import itertools
import statistics
from typing import NamedTuple

from stepscope.trace.model import Trace

__all__ = [
    "IDLE_FRAME",
    "IDLE_NAME",
    "SAMPLED_CATEGORY",
    "SAMPLED_TID_BASE",
    "SampledSpan",
    "SampledTrack",
    "sampled_flame_chart",
]

SAMPLED_CATEGORY = "stepscope_sampled"
"""Category of the synthesized events (readers skip them: the samples are the source)."""
SAMPLED_TID_BASE = 1 << 31
"""Track id of thread ``tid``'s flame chart: ``SAMPLED_TID_BASE + tid`` (Linux tids < 2**22)."""
IDLE_FRAME = "[idle]"
IDLE_NAME = -1
"""The ``SampledSpan.name`` of ``IDLE_FRAME`` (not a string of the trace)."""
GAP_FACTOR = 4
"""A gap longer than this many typical intervals ends the spans (sampling paused)."""
DEFAULT_INTERVAL_NS = 10_000_000


class SampledSpan(NamedTuple):
    """One span of the flame chart (``name``: a string id of the trace, or ``IDLE_NAME``)."""

    name: int
    pid: int
    track: int | str
    start_ns: int
    dur_ns: int


class SampledTrack(NamedTuple):
    """One flame-chart track: where it is and what to call it."""

    pid: int
    track: int | str
    tid: int | str
    name: str


def _track_of(tid: int | str) -> int | str:
    if isinstance(tid, int) and 0 <= tid < SAMPLED_TID_BASE:
        return SAMPLED_TID_BASE + tid
    return f"samples {tid}"


def sampled_flame_chart(trace: Trace) -> tuple[list[SampledSpan], list[SampledTrack]]:
    """The flame-chart spans of every sampled thread, and their tracks."""
    samples = trace.samples
    if not len(samples):
        return [], []
    frames = trace.tables["frames"]
    by_thread: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(samples["pid"], samples["tid"], strict=True)):
        by_thread.setdefault(key, []).append(i)
    names = trace.thread_names()
    chains: dict[int, list[tuple[int, int]]] = {}

    def chain(stack: int) -> list[tuple[int, int]]:
        """(name id, file id) of each frame, root first."""
        found = chains.get(stack)
        if found is None:
            found = chains[stack] = [
                (frames["name"][fid], frames["file"][fid]) for fid in trace.stack_frame_ids(stack)
            ]
        return found

    spans: list[SampledSpan] = []
    tracks: list[SampledTrack] = []
    ts_col, stack_col, idle_col = samples["ts_ns"], samples["stack"], samples["idle"]
    for (pid, tid), rows in by_thread.items():
        rows.sort(key=lambda r: ts_col[r])
        label = trace.label(tid)
        track = _track_of(label)
        thread = names.get((trace.label(pid), label), f"thread {label}")
        tracks.append(SampledTrack(pid, track, label, f"samples: {thread}"))
        timeline = [
            (ts_col[r], [*chain(stack_col[r]), *((IDLE_NAME, IDLE_NAME),) * idle_col[r]])
            for r in rows
        ]
        spans.extend(_merge(timeline, pid, track))
    return spans, tracks


def _merge(
    timeline: list[tuple[int, list[tuple[int, int]]]], pid: int, track: int | str
) -> list[SampledSpan]:
    """Spans from one thread's time-ordered (ts, root-first frame keys) samples."""
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(timeline) if b[0] > a[0]]
    typical = int(statistics.median(gaps)) if gaps else DEFAULT_INTERVAL_NS
    spans: list[SampledSpan] = []
    open_frames: list[tuple[tuple[int, int], int]] = []  # (frame key, start)

    def close_to(depth: int, end: int) -> None:
        while len(open_frames) > depth:
            (name, _), start = open_frames.pop()
            spans.append(SampledSpan(name, pid, track, start, max(end - start, 0)))

    previous: int | None = None
    for ts, keys in timeline:
        if previous is not None and ts - previous > GAP_FACTOR * typical:
            close_to(0, previous + typical)
        common = 0
        limit = min(len(keys), len(open_frames))
        while common < limit and open_frames[common][0] == keys[common]:
            common += 1
        close_to(common, ts)
        open_frames.extend((key, ts) for key in keys[common:])
        previous = ts
    if previous is not None:
        close_to(0, previous + typical)
    return spans
