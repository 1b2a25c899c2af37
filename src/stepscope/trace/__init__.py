"""The interchange model and its file formats."""

from stepscope.trace.chrome_reader import ChromeTraceError, read_chrome_trace
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.model import Span, Trace, TraceBuilder

__all__ = [
    "ChromeTraceError",
    "Span",
    "Trace",
    "TraceBuilder",
    "read_chrome_trace",
    "write_chrome_trace",
]
