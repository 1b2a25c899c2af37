"""stepscope: step-aware performance observability for Python and PyTorch programs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from stepscope._version import __version__
from stepscope.collectors.annotations import record_function, traced
from stepscope.profiler import (
    ExecutionTraceObserver,
    KeyAverages,
    ProfilerAction,
    ProfilerActivity,
    profile,
    schedule,
    tensorboard_trace_handler,
    trace_handler,
)
from stepscope.profiler.on_demand import listen, listen_from_environment
from stepscope.steps import current_step, set_step

if TYPE_CHECKING:
    from stepscope.integrations.notebook import NotebookReport


def load_report(
    path: str | os.PathLike[str], steps: str | None = None, top: int = 10
) -> NotebookReport:
    """Analyse a trace file or directory into a report that displays itself in notebooks."""
    from stepscope.integrations.notebook import load_report as load

    return load(path, steps, top)


__all__ = [
    "ExecutionTraceObserver",
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

listen_from_environment()  # STEPSCOPE_LISTEN=1: attachable from import on
