"""What the function profiler asks of a sampling backend, and the errors backends raise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stepscope.trace.model import Trace

__all__ = ["BackendUnavailable", "FunctionProfilerError", "RunSettings", "Session"]


class FunctionProfilerError(RuntimeError):
    """The function profiler could not start, run or collect a profile."""


class BackendUnavailable(FunctionProfilerError):
    """A backend cannot be used here (its binary is missing, or ptrace is denied)."""


@dataclass(frozen=True)
class RunSettings:
    """What one run samples, and how."""

    rate_hz: float
    thread_id: int
    """Native id of the thread that runs the profiled function."""
    all_threads: bool
    max_duration_s: float
    max_depth: int
    max_samples: int


class Session(Protocol):
    """One running sampler: started by its backend's ``open``, then waited on and stopped."""

    backend: str

    def wait_running(self, timeout_s: float) -> None:
        """Return once samples are being taken; FunctionProfilerError on timeout or failure."""

    def stop(self, timeout_s: float) -> tuple[Trace, bool, int]:
        """Stop; the samples, whether sampling hit the duration limit, and samples dropped."""

    def abort(self) -> None:
        """Stop without results; never raises."""
