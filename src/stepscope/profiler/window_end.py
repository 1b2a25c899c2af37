"""A window's end: what the loop keeps when the collectors stop, and the trace built from it.

``stopped`` runs on the loop's thread right after the collectors stopped: it keeps the window's
context (with what each collector handed over) and the metadata the program gave the window.
``build`` collects every collector into one ``TraceBuilder``, adds the metadata and builds the
``Trace``; the profile runs it on the loop (a handler of the program's own, which expects the
window's results when it is called, as torch's ``on_trace_ready``) or on its writer thread
(stepscope's ``trace_handler``, or no handler), where collectors without ``collects_off_loop``
have been collected on the loop first.  ``WindowTrace`` is what a handler saving off the loop is
given: that window's trace, written the profile's way.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepscope import clock, steps
from stepscope._version import __version__
from stepscope.collectors.base import Collector, WindowContext
from stepscope.distributed import distributed_info
from stepscope.failures import failure_log
from stepscope.gcpause import gc_paused
from stepscope.profiler.arguments import experimental_flag
from stepscope.profiler.writer import SaveJob
from stepscope.trace.chrome_writer import WriteStats, write_chrome_trace
from stepscope.trace.kineto import number_events
from stepscope.trace.model import Trace, TraceBuilder

if TYPE_CHECKING:
    from stepscope.profiler.profile import profile

__all__ = [
    "OFF_LOOP",
    "StoppedWindow",
    "WindowTrace",
    "build",
    "collect",
    "finish",
    "save_job",
    "saves_off_loop",
    "skip_window",
    "stopped",
]

log = logging.getLogger("stepscope")
_failures = failure_log("collectors")
OFF_LOOP = " off-loop"
"""Added to a collector's name in ``collector_ns`` for its time on the writer thread."""


@dataclass
class StoppedWindow:
    """A window whose collectors have stopped, until its trace is built."""

    ctx: WindowContext
    first_step: int
    end_step: int
    """The step at the stop (one past the window's last step)."""
    metadata: dict[str, Any]
    """What the program added to this window's metadata (``add_metadata``), presets included."""
    edge: int
    """The index of the step at whose end the window stopped (``StepTimes.mark_edge``)."""
    thread_names: dict[int, str]
    step_source: dict[str, Any] | None
    """What ends steps (``stepscope_step_source``), taken at the stop: the optimizers it names
    are the live ones, and a save off the loop can outlive them."""
    broken: set[int] = field(default_factory=set)
    """Collectors switched off for this window (by ``id``)."""

    @property
    def label(self) -> str:
        """The window's name, ``window 3 (steps 24-35)``."""
        return steps.window_label(self.ctx.window, self.first_step, self.end_step)


def stopped(prof: profile, ctx: WindowContext, edge: int) -> StoppedWindow:
    """Keep what the window needs from the loop's side (on the loop's thread, at the stop)."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    window = StoppedWindow(
        ctx=ctx,
        first_step=prof._window_first_step,
        end_step=prof.step_num,
        metadata={**prof.preset_metadata, **prof._window_metadata},
        edge=edge,
        thread_names=names,
        step_source=_step_source(prof),
        broken=set(prof._broken),
    )
    prof._window_metadata = {}  # what ``add_metadata`` gives from now on: the next window
    return window


def _step_source(prof: profile) -> dict[str, Any] | None:
    trigger = prof._step_trigger
    if trigger is None:
        return None
    source: dict[str, Any] = {"on": trigger.spec}
    if trigger.spec == "optimizer":
        source["optimizers"] = trigger.optimizers()
    return source


def collect(
    prof: profile,
    window: StoppedWindow,
    builder: TraceBuilder,
    collectors: Iterable[Collector],
    suffix: str = "",
) -> None:
    """Each collector's events into ``builder`` (a failure switches it off for the window);
    ``suffix`` is added to the collectors' names in ``collector_ns`` (``OFF_LOOP``)."""
    for collector in collectors:
        hook = functools.partial(collector.collect, builder, window.ctx)
        prof._guarded(collector, "collect", hook, window, suffix)


def build(prof: profile, window: StoppedWindow, builder: TraceBuilder, suffix: str = "") -> Trace:
    """The window's ``Trace``: its metadata added, then every collector's ``window_built``."""
    ctx = window.ctx
    finish_metadata(prof, window, builder)
    if experimental_flag(prof.experimental_config, "expose_kineto_event_metadata"):
        number_events(builder)
    trace = builder.build()
    for collector in prof.collectors:
        hook = functools.partial(collector.window_built, trace)
        prof._guarded(collector, "window_built", hook, window, suffix)
    summary = f"stepscope: {window.label}: {len(trace.spans)} spans"
    if ctx.summary:
        log.warning(summary + "; " + "; ".join(ctx.summary))
    else:
        log.info(summary)
    return trace


def skip_window(prof: profile) -> bool:
    """Whether the window about to begin is left out: ``max_pending_windows`` windows are being
    saved (counted, in later windows' metadata and the log; its steps are not recorded ones)."""
    if not (saves_off_loop(prof) and prof._writer.full()):
        return False
    prof._skipping = True
    prof._writer.skip(f"window {prof._window_index + 1} (from step {prof.step_num})")
    return True


def saves_off_loop(prof: profile) -> bool:
    """Whether the profile's windows are built and saved on its writer thread: for a handler
    that only saves (stepscope's ``trace_handler``: ``saves_off_loop``), one window at a time.
    Without a handler the trace is the result the program asks for next: built on the loop."""
    handler = prof.on_trace_ready
    return not prof.acc_events and getattr(handler, "saves_off_loop", False) is True


def finish(prof: profile, window: StoppedWindow, handler: Callable[[Any], Any] | None) -> None:
    """Build the window's trace and call ``handler``: on the loop (``handler(prof)``, as torch
    calls ``on_trace_ready``) unless the profile saves off the loop."""
    if saves_off_loop(prof):
        prof.step_times.settle_edge(window.edge, saving=True)
        prof._writer.submit(save_job(prof, window, handler))
        return
    prof._writer.drain("a handler of the program's own came next")  # windows before it first
    with gc_paused():  # the window's trace is built from many small containers
        builder = TraceBuilder()
        collect(prof, window, builder, prof.collectors)
        trace = build(prof, window, builder)
    _keep(prof, trace)
    if handler is not None:
        handler(prof)


def save_job(prof: profile, window: StoppedWindow, handler: Callable[[Any], Any] | None) -> SaveJob:
    """The window's save off the loop: collectors without ``collects_off_loop`` collected now
    (their data stays in them until then), the rest, the build and ``handler`` on the writer."""
    builder = TraceBuilder()
    on_loop = [c for c in prof.collectors if not c.collects_off_loop]
    if on_loop:
        collect(prof, window, builder, on_loop)
    off_loop = [c for c in prof.collectors if c.collects_off_loop]

    def save() -> None:
        try:
            with gc_paused():
                collect(prof, window, builder, off_loop, OFF_LOOP)
                trace = build(prof, window, builder, OFF_LOOP)
            _keep(prof, trace)
            if handler is not None:
                handler(WindowTrace(prof, trace))
        except Exception as exc:
            _failures.report(
                "window_save_error",
                window.label,
                exc,
                strict=prof.strict,
                then="the window is not saved",
                once=(id(prof), "save"),
            )
        finally:
            prof.step_times.settle_edge(window.edge)

    return SaveJob(window.label, save)


def _keep(prof: profile, trace: Trace) -> None:
    """The profile's results: the last window's trace, or every one with ``acc_events``."""
    prof._traces = [*prof._traces, trace] if prof.acc_events else [trace]


def finish_metadata(prof: profile, window: StoppedWindow, builder: TraceBuilder) -> None:
    """Process and thread names, the profile's settings, the window and its step times."""
    ctx = window.ctx
    pid = ctx.pid
    named_processes, named_threads = builder.named_tracks()
    if pid not in named_processes:
        builder.process_name(pid, "python")
    for track_pid, tid in sorted(builder.span_tracks()):
        if track_pid == pid and (pid, tid) not in named_threads:
            label = window.thread_names.get(tid, "python")
            builder.thread_name(pid, tid, f"thread {tid} ({label})")
    meta = builder.metadata
    meta["host_name"] = socket.gethostname()
    for flag in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
        if getattr(prof, flag):
            meta[flag] = 1
    meta["stepscope_version"] = __version__
    meta["stepscope_clock"] = clock.clock_info()
    meta["stepscope_window"] = {
        "index": ctx.window,
        "first_step": window.first_step,
        "last_step": window.end_step,
        "start_ns": ctx.start_ns,
        "end_ns": ctx.end_ns,
    }
    meta["stepscope_activities"] = sorted(a.name for a in prof.activities)
    if window.step_source is not None:
        meta["stepscope_step_source"] = window.step_source
    meta["stepscope_overhead"] = prof.step_times.summary()
    if prof.windows_skipped:
        meta["stepscope_windows_skipped"] = prof.windows_skipped
    meta.update(ctx.metadata)
    meta.update(window.metadata)
    builder.distributed_info = distributed_info()


class WindowTrace:
    """What a handler saving off the loop sees of the profile: one window's trace."""

    def __init__(self, prof: profile, trace: Trace) -> None:
        self._prof = prof
        self._trace = trace
        self.strict = prof.strict
        """The profile's ``strict`` (whether a failed write is re-raised)."""
        self.trace_files = prof.trace_files
        """The profile's list of the files its windows were written to."""

    def trace(self) -> Trace:
        """The window's trace."""
        return self._trace

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> WriteStats:
        """Write the window's trace as a Chrome/Perfetto JSON file (gzip if ``.gz``)."""
        stats = write_chrome_trace(self._trace, path)
        self.trace_files.append(stats.path)
        return stats
