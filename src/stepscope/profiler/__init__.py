"""The step-scheduled profiler (torch.profiler's interface, for any loop)."""

from stepscope.activity import ProfilerActivity
from stepscope.profiler.execution_trace import ExecutionTraceObserver
from stepscope.profiler.handlers import tensorboard_trace_handler, trace_handler
from stepscope.profiler.profile import profile
from stepscope.profiler.schedule import ProfilerAction, schedule
from stepscope.profiler.summary import KeyAverages

__all__ = [
    "ExecutionTraceObserver",
    "KeyAverages",
    "ProfilerAction",
    "ProfilerActivity",
    "profile",
    "schedule",
    "tensorboard_trace_handler",
    "trace_handler",
]
