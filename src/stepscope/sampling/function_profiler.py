"""``FunctionProfiler``: profile exactly one function call with a sampling profiler.

The lifecycle follows torch's strobelight CLI function profiler: one run at a time in the whole
process (a class-wide lock), start the sampler and wait until it samples, run the function, stop
the sampler and keep the results in ``profile_result``.  Profiler failures never break the
function unless ``stop_at_error=True``; the function's own exception propagates unchanged after
the sampler stopped.

``stop_at_error`` keeps strobelight's meaning for the profiler it is given to.  It relates to
the one failure switch, ``stepscope.config.config.strict``, as ``profile(strict=True)`` does:
under ``config.strict`` every profiler behaves as with ``stop_at_error=True``; otherwise each
profiler's own ``stop_at_error`` decides.  Either way a profiler failure that does not raise is
counted (``stepscope.failures.failure_counts()["sampling"]``) and logged once.

Differences from strobelight's, on purpose:

- a concurrent call runs the function unprofiled with a warning (strobelight returned ``None``
  without running it: its ``if not locked`` branch was unreachable);
- results are kept when the function raises (``profile_result.function_raised``);
- with ``stop_at_error=True`` a failure to collect results raises after the function returned.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, cast

from stepscope import clock
from stepscope.collectors.sampler import DEFAULT_MAX_SAMPLES
from stepscope.failures import failure_log, is_strict
from stepscope.sampling.inprocess import InProcessSession
from stepscope.sampling.pyspy import FORMATS, PySpySession
from stepscope.sampling.result import ProfileResult, trim_stacks
from stepscope.sampling.session import (
    BackendUnavailable,
    FunctionProfilerError,
    RunSettings,
    Session,
)

__all__ = ["BACKENDS", "FunctionProfiler", "sampled"]

log = logging.getLogger("stepscope.sampling")
_failures = failure_log("sampling")

BACKENDS = ("inprocess", "py-spy")
F = TypeVar("F", bound=Callable[..., Any])
_run_ids = itertools.count(1)
# Frames of the profiler itself, cut from the root side of every stack.
_ANCHOR_NAMES = ("FunctionProfiler.profile", "profile")


def _function_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a callable (a partial's function), or its repr."""
    target = getattr(fn, "func", fn)
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not isinstance(qualname, str):
        return repr(fn)
    module = getattr(target, "__module__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and module else qualname


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    return float(value)


class FunctionProfiler:
    """Profiles one call of a function with a sampling profiler; results in ``profile_result``."""

    _lock = threading.Lock()
    """Held while any FunctionProfiler in this process is profiling."""

    def __init__(
        self,
        *,
        stop_at_error: bool = False,
        max_profile_duration_sec: float = 600.0,
        sampling_rate_hz: float = 100.0,
        sample_each: float | None = None,
        sample_tags: Iterable[str] | None = None,
        stack_max_len: int = 127,
        timeout_wait_for_running_sec: float = 60.0,
        timeout_wait_for_finished_sec: float = 60.0,
        backend: str = "inprocess",
        py_spy_path: str | os.PathLike[str] = "py-spy",
        py_spy_format: str = "speedscope",
        all_threads: bool = False,
        include_idle: bool = True,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        output_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Settings of every run; ``sample_each`` (seconds between samples) overrides the rate.

        ``stop_at_error``, ``max_profile_duration_sec``, ``sample_each``, ``sample_tags``,
        ``stack_max_len`` (frames kept per stack, the innermost) and the two timeouts are the
        strobelight profiler's keywords, with one difference: ``sample_each`` is seconds between
        samples here, not CPU cycles.  ``sampling_rate_hz`` (samples a second) is stepscope's
        own name for the rate, as in ``profile(sampling_rate_hz=...)``."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if py_spy_format not in FORMATS:
            raise ValueError(f"py_spy_format must be one of {FORMATS}, got {py_spy_format!r}")
        rate = _positive("sampling_rate_hz", sampling_rate_hz)
        if sample_each is not None:
            rate = 1.0 / _positive("sample_each", sample_each)
        if isinstance(stack_max_len, bool) or not isinstance(stack_max_len, int):
            raise TypeError(f"stack_max_len must be an int, got {stack_max_len!r}")
        if stack_max_len < 1:
            raise ValueError(f"stack_max_len must be at least 1, got {stack_max_len}")
        tags = () if sample_tags is None else tuple(sample_tags)
        if isinstance(sample_tags, str) or not all(isinstance(t, str) for t in tags):
            raise TypeError(f"sample_tags must be a list of strings, got {sample_tags!r}")
        self.stop_at_error = bool(stop_at_error)
        self.max_profile_duration_sec = _positive(
            "max_profile_duration_sec", max_profile_duration_sec
        )
        self.sampling_rate_hz = rate
        self.sample_tags = tags
        self.stack_max_len = stack_max_len
        self.timeout_wait_for_running_sec = _positive(
            "timeout_wait_for_running_sec", timeout_wait_for_running_sec
        )
        self.timeout_wait_for_finished_sec = _positive(
            "timeout_wait_for_finished_sec", timeout_wait_for_finished_sec
        )
        self.backend = backend
        self.py_spy_path = py_spy_path
        self.py_spy_format = py_spy_format
        self.all_threads = all_threads
        self.include_idle = include_idle
        self.max_samples = max_samples
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.current_run_id: int | None = None
        """Id of the most recent run (also in output file names)."""
        self.profile_result: ProfileResult | None = None
        """Results of the most recent run (None until one succeeds)."""
        self.output_files: dict[str, Path] = {}
        """Files written for the most recent run when ``output_dir`` is set."""

    # -- the run ---------------------------------------------------------------------------------

    def profile(self, work_function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``work_function(*args, **kwargs)`` under the sampler; returns its result."""
        if not callable(work_function):
            raise TypeError(f"profile() needs a callable, got {work_function!r}")
        self.current_run_id = None
        self.profile_result = None
        self.output_files = {}
        if not FunctionProfiler._lock.acquire(blocking=False):
            self._error("concurrent runs are not supported: another FunctionProfiler is running")
            return work_function(*args, **kwargs)
        try:
            self.current_run_id = next(_run_ids)
            opened = self._open()
            if opened is None:
                return work_function(*args, **kwargs)
            session, fallback = opened
            name = _function_name(work_function)
            start = clock.now_ns()
            try:
                result = work_function(*args, **kwargs)
            except BaseException:
                self._finish(session, fallback, start, raised=True, name=name)
                raise
            self._finish(session, fallback, start, raised=False, name=name)
            return result
        finally:
            FunctionProfiler._lock.release()

    def _raises(self) -> bool:
        """Whether a profiler failure raises: ``stop_at_error``, or ``config.strict``."""
        return self.stop_at_error or is_strict()

    def _error(self, message: str, cause: BaseException | None = None) -> None:
        """Raise with ``stop_at_error`` (the cause's class if it is ours), else count and go on."""
        kind = type(cause) if isinstance(cause, FunctionProfilerError) else FunctionProfilerError
        error = kind(message)
        if self._raises():
            raise error from cause
        _failures.report(
            "profiler_error",
            "the function profiler",
            error,
            strict=False,
            message="the function profiler failed",
            then="the function runs without profiling",
            once=(id(self), message),
        )

    def _settings(self) -> RunSettings:
        return RunSettings(
            rate_hz=self.sampling_rate_hz,
            thread_id=threading.get_native_id(),
            all_threads=self.all_threads,
            max_duration_s=self.max_profile_duration_sec,
            max_depth=self.stack_max_len,
            max_samples=self.max_samples,
        )

    def _start(self, backend: str) -> Session:
        session: Session
        if backend == "py-spy":
            session = PySpySession(self._settings(), self.py_spy_path, self.py_spy_format)
        else:
            session = InProcessSession(self._settings())
        session.wait_running(self.timeout_wait_for_running_sec)
        return session

    def _open(self) -> tuple[Session, str | None] | None:
        """A running session (and why it is not the requested backend), or None after a warning."""
        try:
            return self._start(self.backend), None
        except (FunctionProfilerError, OSError, ValueError) as exc:
            if self.backend == "inprocess" or self._raises():
                self._error(f"could not start the {self.backend} sampler: {exc}", exc)
                return None
            kind = "unavailable" if isinstance(exc, BackendUnavailable) else "failed to start"
            log.warning(
                "stepscope.sampling: py-spy %s (%s); using the in-process sampler", kind, exc
            )
            reason = str(exc)
        try:
            return self._start("inprocess"), reason
        except (FunctionProfilerError, OSError, ValueError) as exc:
            self._error(f"could not start the in-process sampler either: {exc}", exc)
            return None

    def _finish(
        self, session: Session, fallback: str | None, start: int, raised: bool, name: str
    ) -> None:
        """Stop the session and keep its results; raises only with stop_at_error after success."""
        end = clock.now_ns()
        duration_s = (end - start) / 1e9
        try:
            trace, truncated, dropped = session.stop(self.timeout_wait_for_finished_sec)
            anchors = {(name, __file__) for name in _ANCHOR_NAMES}
            # py-spy's sample times are spread over the run, not read: only ours tell the call
            call = (start, end) if session.backend == "inprocess" else None
            trimmed, profiler_samples = trim_stacks(trace, anchors, call)
            result = ProfileResult(
                trace=trimmed,
                backend=session.backend,
                rate_hz=self.sampling_rate_hz,
                duration_s=duration_s,
                run_id=self.current_run_id or 0,
                tags=self.sample_tags,
                include_idle=self.include_idle,
                truncated=truncated,
                function_raised=raised,
                dropped_samples=dropped,
                profiler_samples=profiler_samples,
                fallback_reason=fallback,
                function_name=name,
            )
            if self.output_dir is not None:
                self.output_files = result.write_all(self.output_dir, f"run-{result.run_id}")
        except Exception as exc:
            session.abort()
            if raised or not self._raises():
                _failures.report(
                    "profiler_error",
                    "the function profiler's results",
                    exc,
                    strict=False,
                    message="could not collect the profile",
                    once=id(self),
                )
                return
            raise FunctionProfilerError(f"could not collect the profile: {exc}") from exc
        self.profile_result = result
        log.info(
            "stepscope.sampling: run %s: %s samples in %.3f s (%s)",
            result.run_id,
            result.total_samples,
            duration_s,
            result.backend,
        )


def sampled(profiler: FunctionProfiler | None = None, **options: Any) -> Callable[[F], F]:
    """Decorator: every call of the function is profiled (``@sampled()``, ``@sampled(profiler=p)``,
    ``@sampled(stop_at_error=True, ...)``)."""
    if profiler is not None and not isinstance(profiler, FunctionProfiler):
        raise TypeError(
            "sampled() takes a FunctionProfiler or FunctionProfiler options; "
            "write @sampled() with parentheses"
        )
    if profiler is not None and options:
        raise TypeError("pass either profiler= or FunctionProfiler options to sampled(), not both")
    chosen = profiler if profiler is not None else FunctionProfiler(**options)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return chosen.profile(fn, *args, **kwargs)

        wrapper.profiler = chosen  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate
