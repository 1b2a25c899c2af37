"""One profiled training run as a trainer drives it: start, regions, steps, stop, summary.

The Lightning profiler and the HF Trainer callback both hand their framework's events to a
``TrainingSession``.  Every window is written by ``trace_handler`` into the output directory,
one file per rank (the worker name carries the rank).  A failure inside stepscope is counted
and logged once (area ``integrations``) and never raised into the training loop, unless the
session (or ``config.strict``) is strict.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stepscope.collectors.annotations import record_function
from stepscope.failures import failure_log
from stepscope.profiler.handlers import trace_handler
from stepscope.profiler.profile import profile
from stepscope.profiler.schedule import Schedule

__all__ = ["TrainingSession"]

_failures = failure_log("integrations")


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
        self._handler = trace_handler(self.output_dir, worker_name)
        self.trace_files: list[str] = []
        """Every window written, in order."""
        # built now, so a wrong option is an error where the user wrote it
        self.profile = profile(schedule=schedule, on_trace_ready=self._write, **options)
        self._running = False
        self._open: dict[str, list[Any]] = {}

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
        path = self._handler(prof)
        if path is not None:
            self.trace_files.append(path)

    def _guard(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            _failures.report(
                "integration_error",
                f"{self.who} {what}",
                exc,
                strict=self.strict,
                then="training goes on",
            )

    def start(self) -> None:
        """Start the profile at step 0 (once)."""
        if not self._running:
            self._running = True
            self._guard("start", self.profile.start)

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
        stack = self._open.get(key)
        if stack:
            span = stack.pop()
            self._guard("region end", lambda: span.__exit__(None, None, None))

    def stop(self) -> None:
        """Close every open region and stop the profile (the window in progress is saved)."""
        for key in list(self._open):
            while self._open.get(key):
                self.leave(key)
        self._open.clear()
        if self._running:
            self._running = False
            self._guard("stop", self.profile.stop)

    def summary(self) -> str:
        """The last window's report as Markdown, and where every window was written."""
        traces = self.profile.traces
        if not traces:
            return f"{self.who}: no window was recorded (the schedule reached no RECORD step)."
        from stepscope.analysis.analyze import analyze
        from stepscope.report.markdown import report_markdown

        label = Path(self.trace_files[-1]).name if self.trace_files else "last window"
        text = report_markdown(analyze([(label, traces[-1])]))
        listed = "\n".join(f"- {p}" for p in self.trace_files)
        return f"{text}\nTraces written:\n{listed}\n" if listed else text
