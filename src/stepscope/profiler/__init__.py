"""The step-scheduled profiler (torch.profiler's interface, for any loop)."""

from stepscope.activity import ProfilerActivity
from stepscope.profiler.activity import kineto_available, supported_activities
from stepscope.profiler.events import DeviceType, EventList, FunctionEvent
from stepscope.profiler.execution_trace import ExecutionTraceObserver
from stepscope.profiler.handlers import tensorboard_trace_handler, trace_handler
from stepscope.profiler.profile import profile
from stepscope.profiler.schedule import ProfilerAction, schedule
from stepscope.profiler.summary import KeyAverages, RowAverage

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
