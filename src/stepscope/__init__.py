"""stepscope: step-aware performance observability for Python and PyTorch programs."""

from __future__ import annotations

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

__all__ = [
    "ExecutionTraceObserver",
    "KeyAverages",
    "ProfilerAction",
    "ProfilerActivity",
    "__version__",
    "current_step",
    "listen",
    "profile",
    "record_function",
    "schedule",
    "set_step",
    "tensorboard_trace_handler",
    "trace_handler",
    "traced",
]

listen_from_environment()  # STEPSCOPE_LISTEN=1: attachable from import on
