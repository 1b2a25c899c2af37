"""Profile one function call with a sampling profiler (in-process, or py-spy from outside)."""

from stepscope.sampling.function_profiler import BACKENDS, FunctionProfiler, sampled
from stepscope.sampling.result import FunctionStats, ProfileResult
from stepscope.sampling.session import BackendUnavailable, FunctionProfilerError

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "FunctionProfiler",
    "FunctionProfilerError",
    "FunctionStats",
    "ProfileResult",
    "sampled",
]
