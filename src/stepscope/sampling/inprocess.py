"""The ``inprocess`` backend: stepscope's own stack sampler on a timing thread."""

from __future__ import annotations

import contextlib
import os

from stepscope.collectors.sampler import Sampler, add_samples
from stepscope.sampling.session import FunctionProfilerError, RunSettings
from stepscope.trace.model import Trace, TraceBuilder

__all__ = ["InProcessSession"]


class InProcessSession:
    """Samples the profiled thread (or all threads) with :class:`Sampler`."""

    backend = "inprocess"

    def __init__(self, settings: RunSettings) -> None:
        self._sampler = Sampler(
            settings.rate_hz,
            thread_ids=None if settings.all_threads else [settings.thread_id],
            max_samples=settings.max_samples,
            max_depth=settings.max_depth,
            max_duration_s=settings.max_duration_s,
        )
        self._sampler.start()

    def wait_running(self, timeout_s: float) -> None:
        """Wait for the timing thread."""
        if not self._sampler.wait_running(timeout_s):
            self.abort()
            raise FunctionProfilerError(
                f"the in-process sampler did not start within {timeout_s} s"
            )

    def stop(self, timeout_s: float) -> tuple[Trace, bool, int]:
        """Stop the timing thread and turn its samples into a trace."""
        try:
            data = self._sampler.stop(timeout_s)
        except TimeoutError as exc:
            raise FunctionProfilerError(str(exc)) from exc
        if self._sampler.errors:
            raise FunctionProfilerError(f"the in-process sampler failed: {self._sampler.error}")
        builder = TraceBuilder()
        add_samples(builder, data, os.getpid(), keep_own_frames=True)
        builder.metadata["stepscope_sampler"] = self._sampler.describe(data)
        return builder.build(), self._sampler.truncated, data.dropped

    def abort(self) -> None:
        """Stop without keeping results."""
        if self._sampler.running:
            with contextlib.suppress(Exception):  # the thread is a daemon: nothing more to do
                self._sampler.stop(1.0)
