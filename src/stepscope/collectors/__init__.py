"""Collectors: plugins the profiler drives through prepare / start / stop / collect."""

from stepscope.collectors.base import Collector, WindowContext

__all__ = ["Collector", "WindowContext"]
