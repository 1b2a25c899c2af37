"""Analysis of traces: pure functions over ``Trace`` that answer where a step's time went.

``analyze(traces)`` gives a :class:`~stepscope.analysis.result.Report` (one summary per trace
and all together); ``diff_reports(a, b)`` compares two.  Nothing here reads or writes files.
"""

from stepscope.analysis.result import (
    REPORT_SCHEMA,
    REPORT_SCHEMA_VERSION,
    Category,
    CounterInfo,
    DeviceBreakdown,
    DiffResult,
    DiffRow,
    FunctionRow,
    HostBreakdown,
    KernelRow,
    KernelTypeTime,
    LaunchDelay,
    OperatorRow,
    Recommendation,
    Report,
    StepDiff,
    StepStats,
    StepTime,
    StreamBreakdown,
    TraceSummary,
)

__all__ = [
    "REPORT_SCHEMA",
    "REPORT_SCHEMA_VERSION",
    "Category",
    "CounterInfo",
    "DeviceBreakdown",
    "DiffResult",
    "DiffRow",
    "FunctionRow",
    "HostBreakdown",
    "KernelRow",
    "KernelTypeTime",
    "LaunchDelay",
    "OperatorRow",
    "Recommendation",
    "Report",
    "StepDiff",
    "StepStats",
    "StepTime",
    "StreamBreakdown",
    "TraceSummary",
]
