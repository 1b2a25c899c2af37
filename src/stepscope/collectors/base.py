"""The one interface every collector implements; the profiler's state machine drives it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.trace.model import Trace, TraceBuilder

log = logging.getLogger("stepscope")


@dataclass
class WindowContext:
    """What a collector knows about the recording window it serves."""

    window: int
    """0-based index of the window within this profile."""
    pid: int = field(default_factory=os.getpid)
    start_ns: int = 0
    """Monotonic ns when RECORD began (0 until then)."""
    end_ns: int = 0
    """Monotonic ns when the window stopped (0 until then)."""
    stopping_ns: int = 0
    """Monotonic ns when the window began to stop, before any collector stopped (0 until then):
    no span of the program's ends later than this in the window's trace."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Entries collectors add to the window's trace metadata (drop counts, settings)."""
    summary: list[str] = field(default_factory=list)
    """Short lines for the window's closing summary (e.g. what was dropped)."""
    held: dict[int, Any] = field(default_factory=dict)
    """What each collector recorded, handed over at ``stop`` (keyed by ``id(collector)``) for
    a ``collect`` that may run after the next window has started (``collects_off_loop``)."""
    loop_waits: Callable[[], bool] = field(default=lambda: False)
    """Whether the training loop is waiting for the window's save now (``profile.stop()``, the
    program's exit): work off the loop need not keep out of its way then."""


class Collector:
    """Base class of collectors: each records one kind of data inside RECORD windows.

    ``begin`` is called once when the profile starts (for what must see the program from its
    start, before any window: a DataLoader's workers are started long before the first one).
    Lifecycle per window: ``prepare`` (WARMUP, or just before start), ``start`` (RECORD begins),
    ``on_step`` (each step boundary while recording), ``stop`` (window ends), ``collect``
    (append the window's events to the trace), ``window_built`` (the finished trace).
    ``close`` is called once when the profiler exits.  Nothing may be installed before
    ``start`` or left installed after ``stop``.

    Everything up to ``stop`` runs on the training loop's thread.  When the profile saves off
    the loop, ``collect`` of a collector with ``collects_off_loop`` and every ``window_built``
    run on the profile's writer thread, possibly after the next window has started: such a
    collector hands its window's data over at ``stop`` (``ctx.held[id(self)]``) and reads only
    that in ``collect``.  The others collect on the loop's thread right after the stop.
    """

    name = "collector"
    collects_off_loop = False
    """Whether ``collect`` may run on the writer thread after the next window has started (it
    reads only what ``stop`` left in ``ctx.held``)."""
    strict: bool | None = None
    """Re-raise this collector's own failures: None follows ``config.strict`` (the profile that
    builds a collector sets its own ``strict=`` here)."""

    def begin(self) -> None:
        """The profile started (``close`` undoes what this installs)."""

    def prepare(self, ctx: WindowContext) -> None:
        """Get ready to record (allocate, warm caches) without recording yet."""

    def start(self, ctx: WindowContext) -> None:
        """Begin recording."""

    def on_step(self, ctx: WindowContext, step: int) -> None:
        """A step boundary inside a recording window (``step`` is the step now starting)."""

    def stop(self, ctx: WindowContext) -> None:
        """Stop recording; keep what was recorded until ``collect``."""

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Append the recorded events of this window to ``builder``."""

    def window_built(self, trace: Trace) -> None:
        """The window's whole trace, once every collector has added to it (read-only)."""

    def close(self) -> None:
        """Release everything (the profiler is done)."""

    def after_fork_in_child(self) -> None:
        """In a child forked during a window: stop recording the parent's window, keep nothing."""
