"""A flight recorder dump: what the ring held when a trigger fired, as an ordinary ``Trace``.

A ``Snapshot`` is taken on the thread that saw the trigger (the loop's for a slow step or an
exception, the watchdog's for a hang or SIGUSR1, the listener's for ``attach --dump``): a copy
of the ring's rows (immutable tuples, so the copy is one C-level list copy) and, for a dump
taken inside a step, that open step.  ``build_dump`` turns it and the sampler's samples of the
same time into a trace: one ``ProfilerStep#N`` span per step (the open one flagged
``stepscope.open_at_window_end``, so readers list it as cut short), the annotations that ended
in those steps, the stack samples taken from the first kept step's start to the dump, and a
``stepscope_flight`` metadata entry that says why it was written.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stepscope import clock
from stepscope._version import __version__
from stepscope.collectors.annotations import OPEN_FLAG, SpanTuple, _span_args
from stepscope.collectors.sampler import SamplerData, add_samples
from stepscope.distributed import distributed_info
from stepscope.trace.model import Trace, TraceBuilder

__all__ = ["Row", "Snapshot", "build_dump", "thread_stacks"]

Row = tuple[int, int, int, int, tuple[SpanTuple, ...] | list[SpanTuple]]
"""One kept step: (step, start ns, end ns, native id of the thread that ended it, the
annotation spans that ended during it)."""
STACK_DEPTH = 64
"""Frames kept per thread in a dump's ``stacks`` (the innermost)."""


@dataclass
class Snapshot:
    """The ring as it was when a trigger fired (see the module doc)."""

    reason: str
    """``slow_step``, ``exception``, ``hang``, ``signal`` or ``attach``."""
    detail: str
    """The trigger in words (``step 41 took 312 ms, 10.4x the median of 30 ms``)."""
    step: int
    """The bad step: the slow one, or the one open when the trigger fired."""
    taken_ns: int
    rows: list[Row]
    open_step: tuple[int, int, int] | None = None
    """(step, start ns, thread) of the step running when the trigger fired, if it is kept."""
    stacks: dict[str, Any] | None = None
    """Every thread's stack at the trigger (``thread_stacks``), for hangs and requests."""
    facts: dict[str, Any] = field(default_factory=dict)
    """The recorder's state: median, threshold, suppressed dumps, drops (metadata)."""
    open_spans: list[SpanTuple] = field(default_factory=list)
    """The annotation spans that ended in the open step so far."""

    @property
    def first_ns(self) -> int:
        """When the first kept step began."""
        if self.rows:
            return self.rows[0][1]
        return self.open_step[1] if self.open_step is not None else self.taken_ns

    @property
    def steps(self) -> list[int]:
        """The step numbers the dump holds, oldest first."""
        found = [row[0] for row in self.rows]
        if self.open_step is not None:
            found.append(self.open_step[0])
        return found


def thread_stacks() -> dict[str, Any]:
    """Every Python thread's stack now, innermost frame last: ``{native id: {name, frames}}``."""
    threads = {t.ident: t for t in threading.enumerate()}
    found: dict[str, Any] = {}
    for ident, top in sys._current_frames().items():
        frames: list[str] = []
        frame: Any = top
        while frame is not None and len(frames) < STACK_DEPTH:
            code = frame.f_code
            name = getattr(code, "co_qualname", code.co_name)
            frames.append(f"{name} ({code.co_filename}:{frame.f_lineno})")
            frame = frame.f_back
        frames.reverse()
        thread = threads.get(ident)
        native = thread.native_id if thread is not None and thread.native_id else ident
        found[str(native)] = {
            "name": thread.name if thread is not None else "",
            "frames": frames,
            "truncated": frame is not None,
        }
    return found


def _samples_between(data: SamplerData, lo: int, hi: int) -> SamplerData:
    """The samples of ``data`` taken from ``lo`` to ``hi`` (the same frames and stacks)."""
    keep = [i for i, ts in enumerate(data.sample_ts) if lo <= ts <= hi]
    if len(keep) == len(data.sample_ts):
        return data

    def pick(column: array[int]) -> array[int]:
        return array(column.typecode, (column[i] for i in keep))

    return replace(
        data,
        sample_tid=pick(data.sample_tid),
        sample_ts=pick(data.sample_ts),
        sample_stack=pick(data.sample_stack),
        sample_idle=pick(data.sample_idle),
    )


def build_dump(
    snap: Snapshot,
    samples: list[SamplerData],
    index: int,
    metadata: dict[str, Any] | None = None,
    pid: int | None = None,
) -> Trace:
    """The dump's trace: steps, their annotations, the samples of the same time, metadata
    (``metadata``: more entries, the profile's step times)."""
    pid = pid if pid is not None else os.getpid()
    builder = TraceBuilder()
    span = builder.span
    loop_threads: set[int] = set()
    for step, start, end, tid, spans in snap.rows:
        span(f"ProfilerStep#{step}", "user_annotation", pid, tid, start, end - start)
        loop_threads.add(tid)
        _add_spans(builder, spans, pid)
    _add_spans(builder, snap.open_spans, pid)
    if snap.open_step is not None:
        step, start, tid = snap.open_step
        loop_threads.add(tid)
        span(f"ProfilerStep#{step}", "user_annotation", pid, tid, start,
             max(0, snap.taken_ns - start), {OPEN_FLAG: True})  # fmt: skip
    kept = 0
    for data in samples:
        kept += add_samples(builder, _samples_between(data, snap.first_ns, snap.taken_ns), pid)
    for tid in sorted(loop_threads):
        builder.instant(f"flight recorder: {snap.reason}", "stepscope", pid, tid, snap.taken_ns,
                        args={"detail": snap.detail})  # fmt: skip
    _name_tracks(builder, pid)
    steps = snap.steps
    meta = builder.metadata
    meta["host_name"] = socket.gethostname()
    meta["stepscope_version"] = __version__
    meta["stepscope_clock"] = clock.clock_info()
    meta["stepscope_window"] = {
        "index": index,
        "first_step": steps[0] if steps else snap.step,
        "last_step": (steps[-1] if steps else snap.step) + 1,
        "start_ns": snap.first_ns,
        "end_ns": snap.taken_ns,
    }
    flight: dict[str, Any] = {
        "reason": snap.reason,
        "detail": snap.detail,
        "step": snap.step,
        "steps": len(steps),
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "open_step": snap.open_step[0] if snap.open_step is not None else None,
        "samples": kept,
        **snap.facts,
    }
    if snap.stacks is not None:
        flight["stacks"] = snap.stacks
    meta["stepscope_flight"] = flight
    meta.update(metadata or {})
    builder.distributed_info = distributed_info()
    return builder.build()


def _add_spans(builder: TraceBuilder, spans: Sequence[SpanTuple], pid: int) -> None:
    for name, args, start, end, tid in spans:
        builder.span(name, "user_annotation", pid, tid, start, end - start, _span_args(args))


def _name_tracks(builder: TraceBuilder, pid: int) -> None:
    builder.process_name(pid, "python")
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    _, named = builder.named_tracks()
    for track_pid, tid in sorted(builder.span_tracks()):
        if track_pid == pid and (pid, tid) not in named:
            builder.thread_name(pid, tid, f"thread {tid} ({names.get(tid, 'python')})")
