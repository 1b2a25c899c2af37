"""stepscope: step-aware performance observability for Python and PyTorch programs.

The public names are imported on first use: ``import stepscope`` alone (which every
``stepscope.*`` module's import runs first) loads none of the profiler, so the readers
(``stepscope report``, ``fleet``, ``diff``) start without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from stepscope._version import __version__
from stepscope.lazy import lazy_names

if TYPE_CHECKING:
    from stepscope.activity import ProfilerActivity
    from stepscope.collectors.annotations import record_function, traced
    from stepscope.integrations.notebook import NotebookReport
    from stepscope.profiler.execution_trace import ExecutionTraceObserver
    from stepscope.profiler.flight_options import FlightRecorder
    from stepscope.profiler.handlers import tensorboard_trace_handler, trace_handler
    from stepscope.profiler.on_demand import listen
    from stepscope.profiler.profile import profile
    from stepscope.profiler.schedule import ProfilerAction, schedule
    from stepscope.profiler.summary import KeyAverages
    from stepscope.steps import current_step, set_step

_WHERE = {
    "record_function": "stepscope.collectors.annotations",
    "traced": "stepscope.collectors.annotations",
    "ExecutionTraceObserver": "stepscope.profiler.execution_trace",
    "FlightRecorder": "stepscope.profiler.flight_options",
    "KeyAverages": "stepscope.profiler.summary",
    "ProfilerAction": "stepscope.profiler.schedule",
    "ProfilerActivity": "stepscope.activity",
    "profile": "stepscope.profiler.profile",
    "schedule": "stepscope.profiler.schedule",
    "tensorboard_trace_handler": "stepscope.profiler.handlers",
    "trace_handler": "stepscope.profiler.handlers",
    "listen": "stepscope.profiler.on_demand",
    "current_step": "stepscope.steps",
    "set_step": "stepscope.steps",
}
"""Each lazily imported public name and the module that defines it."""


__getattr__, __dir__ = lazy_names(globals(), _WHERE)


def load_report(
    path: str | os.PathLike[str], steps: str | None = None, top: int = 10
) -> NotebookReport:
    """Analyse a trace file or directory into a report that displays itself in notebooks."""
    from stepscope.integrations.notebook import load_report as load

    return load(path, steps, top)


__all__ = [
    "ExecutionTraceObserver",
    "FlightRecorder",
    "KeyAverages",
    "ProfilerAction",
    "ProfilerActivity",
    "__version__",
    "current_step",
    "listen",
    "load_report",
    "profile",
    "record_function",
    "schedule",
    "set_step",
    "tensorboard_trace_handler",
    "trace_handler",
    "traced",
]

if os.environ.get("STEPSCOPE_LISTEN", "").strip():  # attachable from import on
    from stepscope.profiler.on_demand import listen_from_environment

    listen_from_environment()
