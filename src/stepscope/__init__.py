"""stepscope: step-aware performance observability for Python and PyTorch programs.

The public names are imported on first use: ``import stepscope`` alone (which every
``stepscope.*`` module's import runs first) loads none of the profiler, so the readers
(``stepscope report``, ``fleet``, ``diff``) start without it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from stepscope._version import __version__

if TYPE_CHECKING:
    from stepscope.activity import ProfilerActivity
    from stepscope.collectors.annotations import record_function, traced
    from stepscope.integrations.notebook import NotebookReport
    from stepscope.profiler.execution_trace import ExecutionTraceObserver
    from stepscope.profiler.handlers import tensorboard_trace_handler, trace_handler
    from stepscope.profiler.on_demand import listen
    from stepscope.profiler.profile import profile
    from stepscope.profiler.schedule import ProfilerAction, schedule
    from stepscope.profiler.summary import KeyAverages
    from stepscope.steps import current_step, set_step

_WHERE = {
    "record_function": "stepscope.collectors.annotations",
    "traced": "stepscope.collectors.annotations",
    "ExecutionTraceObserver": "stepscope.profiler",
    "KeyAverages": "stepscope.profiler",
    "ProfilerAction": "stepscope.profiler",
    "ProfilerActivity": "stepscope.profiler",
    "profile": "stepscope.profiler",
    "schedule": "stepscope.profiler",
    "tensorboard_trace_handler": "stepscope.profiler",
    "trace_handler": "stepscope.profiler",
    "listen": "stepscope.profiler.on_demand",
    "current_step": "stepscope.steps",
    "set_step": "stepscope.steps",
}
"""Each lazily imported public name and the module that defines it."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept as a plain global)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *__all__})


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

if os.environ.get("STEPSCOPE_LISTEN", "").strip():  # attachable from import on
    from stepscope.profiler.on_demand import listen_from_environment

    listen_from_environment()
