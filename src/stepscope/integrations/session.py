"""One profiled training run as a trainer drives it: start, regions, steps, stop, summary.

The Lightning profiler and the HF Trainer callback both hand their framework's events to a
``TrainingSession``.  Every window is written by ``trace_handler`` into the output directory,
one file per rank (the worker name carries the rank).  A failure inside stepscope is counted
and logged once (area ``integrations``) and never raised into the training loop, unless the
session (or ``config.strict``) is strict; a trace directory that cannot be created turns the
session off (training goes on unprofiled).  When training raises, the trainer's integration
calls :meth:`TrainingSession.fail`: the window in progress is saved, marked incomplete (the
step that raised is cut short) with what was raised, and the profile stops, so the program's
exception goes on unchanged and a later profile in the process can start.  A session still
running at interpreter exit is stopped then (a profile left running at exit crashes torch's
profiler in the interpreter's teardown).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stepscope.collectors.annotations import record_function
from stepscope.failures import failure_log
from stepscope.profiler.handlers import trace_handler
from stepscope.profiler.profile import profile
from stepscope.profiler.schedule import ProfilerAction, Schedule

__all__ = ["TrainingSession"]

_failures = failure_log("integrations")

ERROR_KEY = "stepscope_training_error"
"""Trace metadata of a window that training's exception cut short: ``"<Type>: <message>"``."""
_ERROR_TEXT_MAX = 500

_running: weakref.WeakSet[TrainingSession] = weakref.WeakSet()
_at_exit_lock = threading.Lock()
_at_exit_registered = False


def _stop_at_exit() -> None:
    """Stop every session still running (training that ended without its framework's end event,
    e.g. a ``Trainer`` subclass whose own ``train`` raised)."""
    for session in list(_running):
        with contextlib.suppress(Exception):
            session.stop()


def _stop_sessions_at_exit() -> None:
    global _at_exit_registered
    with _at_exit_lock:
        if not _at_exit_registered:
            atexit.register(_stop_at_exit)
            _at_exit_registered = True


def open_session(
    output_dir: str | os.PathLike[str],
    schedule: Schedule | None,
    options: Mapping[str, Any],
    *,
    who: str,
    worker_name: str | None = None,
) -> TrainingSession | None:
    """A session as a trainer begins (its options were checked where the user wrote them):
    None, counted and logged once, when it cannot be made (re-raised when strict)."""
    try:
        return TrainingSession(output_dir, schedule, options, worker_name=worker_name, who=who)
    except Exception as exc:
        _failures.report(
            "integration_error",
            f"{who} set-up",
            exc,
            strict=options.get("strict"),
            then="training goes on unprofiled",
        )
        return None


def _error_text(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a __str__ that raises
        text = type(exc).__name__
    return text if len(text) <= _ERROR_TEXT_MAX else text[: _ERROR_TEXT_MAX - 3] + "..."


class TrainingSession:
    """A ``stepscope.profile`` for a trainer: named regions, a step per call to ``step``."""

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        schedule: Schedule | None,
        options: Mapping[str, Any],
        *,
        worker_name: str | None = None,
        who: str = "stepscope",
    ) -> None:
        self.check_options(schedule, options, who)
        self.output_dir = Path(output_dir)
        self.who = who
        self.strict: bool | None = options.get("strict")
        self.trace_files: list[str] = []
        """Every window written, in order."""
        # built now, so a wrong option is an error where the user wrote it
        self.profile = profile(schedule=schedule, on_trace_ready=self._write, **options)
        self._running = False
        self._open: dict[str, list[Any]] = {}
        self.off_reason = ""
        """Why the session records nothing (empty while it can record)."""
        self._handler: Callable[[profile], str | None] | None = None
        try:
            self._handler = trace_handler(self.output_dir, worker_name)
        except OSError as exc:  # a directory we cannot create never stops training
            self.off_reason = f"{type(exc).__name__}: {exc}"
            _failures.report(
                "integration_error",
                f"{who} trace directory",
                exc,
                strict=self.strict,
                then="training goes on without profiling",
            )

    @staticmethod
    def check_options(schedule: Schedule | None, options: Mapping[str, Any], who: str) -> None:
        """Raise where the user wrote them for options ``profile`` would refuse."""
        if "on_trace_ready" in options:
            raise ValueError(
                f"{who} writes every window into its output directory itself: leave out "
                "on_trace_ready"
            )
        profile(schedule=schedule, **options)

    @property
    def running(self) -> bool:
        """Whether the profile has started and not stopped."""
        return self._running

    def _write(self, prof: profile) -> None:
        path = self._handler(prof) if self._handler is not None else None
        if path is not None:
            self.trace_files.append(path)

    def _guard(
        self, what: str, fn: Callable[[], Any], *, strict: bool | None = None, then: str = ""
    ) -> bool:
        """Run ``fn``; a failure is counted, logged once, re-raised only when strict; returns
        whether ``fn`` ran through."""
        try:
            fn()
        except Exception as exc:
            _failures.report(
                "integration_error",
                f"{self.who} {what}",
                exc,
                strict=self.strict if strict is None else strict,
                then=then or "training goes on",
            )
            return False
        return True

    def start(self) -> None:
        """Start the profile at step 0 (once; never when the session is off)."""
        if not self._running and not self.off_reason:
            self._running = True
            _running.add(self)
            _stop_sessions_at_exit()
            if not self._guard("start", self.profile.start, then="training goes on unprofiled"):
                # a start that fails leaves no profile running: not tried again at every step
                self._running = False
                _running.discard(self)
                self.off_reason = "the profile could not start"

    def step(self) -> None:
        """One training step ended; the next begins."""
        if self._running:
            self._guard("step", self.profile.step)

    def enter(self, name: str, key: str | None = None) -> None:
        """Open the region ``name`` (closed by ``leave(key)``, ``key`` defaults to ``name``)."""
        if not self._running:
            return

        def opened() -> None:
            span = record_function(name)
            span.__enter__()
            self._open.setdefault(key or name, []).append(span)

        self._guard("region start", opened)

    def leave(self, key: str) -> None:
        """Close the innermost open region under ``key`` (nothing when none is open)."""
        self._leave(key, None, "")

    def _leave(self, key: str, strict: bool | None, then: str) -> None:
        stack = self._open.get(key)
        if stack:
            span = stack.pop()
            self._guard(
                "region end", lambda: span.__exit__(None, None, None), strict=strict, then=then
            )

    def stop(self) -> None:
        """Close every open region and stop the profile (the window in progress is saved)."""
        self._close(None, "")

    def _close(self, strict: bool | None, then: str) -> None:
        for key in list(self._open):
            while self._open.get(key):
                self._leave(key, strict, then)
        self._open.clear()
        if self._running:
            self._running = False
            _running.discard(self)
            self._guard("stop", self.profile.stop, strict=strict, then=then)

    def fail(self, exc: BaseException) -> None:
        """Training raised ``exc``: the window in progress is saved, marked incomplete (the
        step that raised is cut short) with ``"<Type>: <message>"`` under :data:`ERROR_KEY`,
        and the profile stops.  Never raises, even when strict: the program's own exception is
        on its way (a failure here is counted and logged once)."""
        then = "the program's own exception goes on"
        if self._running and self.profile.current_action is not ProfilerAction.NONE:
            # a window is warming up or recording (else the note would wait for the next one)
            text = _error_text(exc)

            def note() -> None:
                self.profile.add_metadata(ERROR_KEY, text)
                self.profile.add_metadata_json("stepscope_window_complete", "false")

            self._guard("window note", note, strict=False, then=then)
        self._close(False, then)

    def summary(self) -> str:
        """The last window's report as Markdown, and where every window was written."""
        if self.off_reason:
            return f"{self.who}: no window was recorded ({self.off_reason})."
        traces = self.profile.traces
        if not traces:
            return f"{self.who}: no window was recorded (the schedule reached no RECORD step)."
        from stepscope.analysis.analyze import analyze
        from stepscope.report.markdown import report_markdown

        label = Path(self.trace_files[-1]).name if self.trace_files else "last window"
        text = report_markdown(analyze([(label, traces[-1])]))
        listed = "\n".join(f"- {p}" for p in self.trace_files)
        return f"{text}\nTraces written:\n{listed}\n" if listed else text
