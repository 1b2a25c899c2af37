"""The step-scheduled profiler (torch.profiler's interface, for any loop).

Its names load on first use: importing one module of the package (the attach client's
protocol, say) does not import the whole profiler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.lazy import lazy_names

if TYPE_CHECKING:
    from stepscope.activity import ProfilerActivity
    from stepscope.profiler.activity import kineto_available, supported_activities
    from stepscope.profiler.events import DeviceType, EventList, FunctionEvent
    from stepscope.profiler.execution_trace import ExecutionTraceObserver
    from stepscope.profiler.handlers import tensorboard_trace_handler, trace_handler
    from stepscope.profiler.profile import profile
    from stepscope.profiler.schedule import ProfilerAction, schedule
    from stepscope.profiler.summary import KeyAverages, RowAverage

_WHERE = {
    "ProfilerActivity": "stepscope.activity",
    "kineto_available": "stepscope.profiler.activity",
    "supported_activities": "stepscope.profiler.activity",
    "DeviceType": "stepscope.profiler.events",
    "EventList": "stepscope.profiler.events",
    "FunctionEvent": "stepscope.profiler.events",
    "ExecutionTraceObserver": "stepscope.profiler.execution_trace",
    "tensorboard_trace_handler": "stepscope.profiler.handlers",
    "trace_handler": "stepscope.profiler.handlers",
    "profile": "stepscope.profiler.profile",
    "ProfilerAction": "stepscope.profiler.schedule",
    "schedule": "stepscope.profiler.schedule",
    "KeyAverages": "stepscope.profiler.summary",
    "RowAverage": "stepscope.profiler.summary",
}
"""Each public name and the module that defines it."""

__getattr__, __dir__ = lazy_names(globals(), _WHERE)

__all__ = [
    "DeviceType",
    "EventList",
    "ExecutionTraceObserver",
    "FunctionEvent",
    "KeyAverages",
    "ProfilerAction",
    "ProfilerActivity",
    "RowAverage",
    "kineto_available",
    "profile",
    "schedule",
    "supported_activities",
    "tensorboard_trace_handler",
    "trace_handler",
]
