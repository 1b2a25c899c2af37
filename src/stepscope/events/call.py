"""One logged call: its attributes, span links and timing, and the events it sends.

A :class:`Spec` is what a decorator (or a context manager) was configured with; it decides per
call whether anyone wants events (``logger.isEnabledFor(level)``) or a span (a profiler window
records), and only then builds a :class:`Call`.  Events go to the ``logging`` logger as records
whose ``msg`` is the :class:`~stepscope.events.event.Event`; the span goes into the recording
window through ``emit_span`` when the call ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextvars import Token
from typing import Any

from stepscope import forks
from stepscope._ext import native
from stepscope.clock import now_ns, to_unix_ns
from stepscope.collectors import annotations as trace_annotations
from stepscope.distributed import rank_and_world_size
from stepscope.events.coerce import AttrSet, get_limits, truncate
from stepscope.events.context import CURRENT, new_span_id, next_seq, process_id
from stepscope.events.event import Event
from stepscope.events.extractors import Binder, Extractor
from stepscope.events.failures import report_failure
from stepscope.steps import current_step

__all__ = ["Call", "Spec", "enabled_probe", "recording", "recording_probe"]


def recording_probe() -> Callable[[], object]:
    """The cheapest check of "a profiler window records annotations now"."""
    mod = native()
    if (
        mod is not None
        and trace_annotations.default_backend is not trace_annotations.python_backend
    ):
        probe: Callable[[], object] = mod._annotations_recording  # one C call, no Python frames
        return probe
    return trace_annotations.is_recording


recording = recording_probe()
"""Whether a profiler window records annotations now (truthy / falsy)."""


def error_type(exc: BaseException) -> str:
    """``ValueError`` for builtins, ``package.module.Name`` otherwise."""
    cls = type(exc)
    module = getattr(cls, "__module__", "")
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def error_message(exc: BaseException) -> str:
    """``str(exc)`` cut to the string limit (``<unprintable>`` when ``str`` fails)."""
    try:
        text = str(exc)
    except Exception:
        text = f"<unprintable {type(exc).__name__}>"
    return truncate(text, get_limits().max_chars)


def enabled_probe(logger: logging.Logger) -> Callable[[int], object]:
    """``level -> False | True | None``: the logger's cached answer (None: not cached yet).

    ``logging`` keeps ``isEnabledFor`` answers in ``Logger._cache`` and clears that dict
    whenever a level (or ``logging.disable``) changes, so reading it is always current.  For
    loggers without it (another ``Logger`` class), ask ``isEnabledFor`` each time.
    """
    cache = getattr(logger, "_cache", None)
    if isinstance(cache, dict) and type(logger).isEnabledFor is logging.Logger.isEnabledFor:
        return cache.get
    return logger.isEnabledFor


class _RankCache:
    """``rank_and_world_size()``, kept once a rank is known; while unknown, asked at most 1/s.

    The rank of a process is fixed at launch (``RANK``) or at ``init_process_group``; looking
    it up costs about a microsecond (environment reads), too much for every event.
    """

    __slots__ = ("checked_ns", "value")

    def __init__(self) -> None:
        self.value: tuple[int | None, int | None] = (None, None)
        self.checked_ns: int | None = None

    def get(self) -> tuple[int | None, int | None]:
        value = self.value
        if value[0] is not None:
            return value
        now = now_ns()
        checked = self.checked_ns
        if checked is None or now - checked >= 1_000_000_000:
            self.checked_ns = now
            try:
                value = self.value = rank_and_world_size()
            except Exception as exc:
                report_failure("rank_lookup_error", "rank_and_world_size", exc)
        return value


_ranks = _RankCache()


def _reset_in_child() -> None:
    global _ranks
    _ranks = _RankCache()


forks.after_fork_in_child(_reset_in_child)


LateHook = Callable[[tuple[Any, ...], dict[str, Any], BaseException], None]


class Spec:
    """The configuration of one decorated function (or one context manager)."""

    __slots__ = (
        "binder",
        "enabled",
        "error_level",
        "error_level_name",
        "extractors",
        "file",
        "func",
        "level",
        "level_name",
        "line",
        "log_exceptions",
        "logger",
        "name",
        "static",
    )

    def __init__(
        self,
        name: str,
        level: int,
        log_exceptions: bool,
        logger: logging.Logger,
        extractors: tuple[Extractor, ...],
        binder: Binder | None,
        static: AttrSet,
        where: tuple[str, int, str | None],
    ) -> None:
        self.name = name
        self.level = level
        self.level_name = logging.getLevelName(level)
        self.log_exceptions = log_exceptions
        self.error_level = logging.ERROR if log_exceptions else level
        self.error_level_name = logging.getLevelName(self.error_level)
        self.logger = logger
        self.enabled = enabled_probe(logger)
        self.extractors = extractors
        self.binder = binder
        self.static = static
        self.file, self.line, self.func = where

    def wanted(self) -> bool:
        """Whether events or a span may be wanted (a cheap check; ``begin`` decides)."""
        enabled = self.enabled(self.level) is not False and not self.logger.disabled
        return enabled or bool(recording())

    def hooks(self) -> tuple[Callable[[], bool], Callable[..., Call | None], LateHook, bool]:
        """``(wanted, begin, late_exception, log_exceptions)``, bound once for a wrapper."""
        return self.wanted, self.begin, self.late_exception, self.log_exceptions

    def begin(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], activate: bool = True
    ) -> Call | None:
        """Start a call when events or a span are wanted; None (nothing computed) otherwise."""
        log = self.logger.isEnabledFor(self.level)
        span = bool(recording())
        if not (log or span):
            return None
        call = Call(self, args, kwargs, log, span)
        if activate:
            call.activate()
        call.start()
        return call

    def late_exception(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException
    ) -> None:
        """``log_exceptions``: an exception of a call whose start nobody wanted."""
        if self.logger.isEnabledFor(self.error_level):
            Call(self, args, kwargs, False, False).fail(exc)

    def attributes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> AttrSet:
        """Static attributes plus what the extractors take from the call's arguments."""
        attrs = self.static.copy()
        binder = self.binder
        if binder is not None:
            try:
                arguments = binder(args, kwargs)
            except Exception as exc:
                attrs.dropped += len(self.extractors)
                report_failure("extractor_error", f"binding the arguments of {self.name!r}", exc)
                return attrs
            for extractor in self.extractors:
                extractor.run(arguments, attrs)
        return attrs


class Call:
    """The state of one logged call (also the handle a context manager yields)."""

    __slots__ = (
        "attrs",
        "log",
        "parent",
        "span",
        "span_id",
        "spec",
        "start_ns",
        "token",
        "who",
    )

    def __init__(
        self,
        spec: Spec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        log: bool,
        span: bool,
    ) -> None:
        self.spec = spec
        self.log = log
        self.span = span
        self.attrs = spec.attributes(args, kwargs)
        self.parent = CURRENT.get()
        self.span_id = new_span_id()
        self.token: Token[Call | None] | None = None
        self.start_ns: int | None = None
        self.who: tuple[int | None, int | None] | None = None

    # -- the context variable -----------------------------------------------------------------

    def activate(self) -> None:
        """Make this the current call of the running context (for parent links)."""
        self.token = CURRENT.set(self)

    def deactivate(self) -> None:
        """Restore the current call that was there before :meth:`activate`."""
        token, self.token = self.token, None
        if token is not None:
            try:
                CURRENT.reset(token)
            except ValueError:  # ended in another context than it began in
                CURRENT.set(self.parent)

    # -- public handle --------------------------------------------------------------------------

    def set(self, name: str, value: Any) -> bool:
        """Add an attribute for the events still to come; False when it does not fit."""
        if not isinstance(name, str):
            raise TypeError(f"attribute names are strings, got {type(name).__name__}")
        return self.attrs.add(name, value)

    # -- events ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Take the start time and send the ``start`` event."""
        self.start_ns = now = now_ns()
        if self.log:
            spec = self.spec
            self._emit("start", now, spec.level, spec.level_name, None)

    def finish(self, status: str = "ok") -> None:
        """The call returned (or a generator ended): ``end`` event and span."""
        end = now_ns()
        self.deactivate()
        start = self.start_ns if self.start_ns is not None else end
        spec = self.spec
        if self.log:
            extra = {"duration_ns": end - start, "status": status}
            self._emit("end", end, spec.level, spec.level_name, extra)
        if self.span:
            self._span(start, end, status, None)

    def fail(self, exc: BaseException) -> None:
        """The call raised ``exc``: ``exception`` event and span (the caller re-raises)."""
        end = now_ns()
        self.deactivate()
        spec = self.spec
        error = {"type": error_type(exc), "message": error_message(exc)}
        if spec.logger.isEnabledFor(spec.error_level):
            started = self.start_ns
            extra = {
                "duration_ns": None if started is None else end - started,
                "status": "error",
                "error": error,
            }
            self._emit("exception", end, spec.error_level, spec.error_level_name, extra)
        if self.span:
            self._span(self.start_ns if self.start_ns is not None else end, end, "error", error)

    def _emit(
        self, phase: str, mono: int, level: int, level_name: str, extra: dict[str, Any] | None
    ) -> None:
        spec = self.spec
        try:
            who = self.who
            if who is None:  # once per call, and only when an event is sent
                who = self.who = _ranks.get()
            parent = self.parent
            logger = spec.logger
            thread = threading.current_thread()
            event = Event(
                event=spec.name,
                phase=phase,
                level=level_name,
                ts_ns=to_unix_ns(mono),
                mono_ns=mono,
                seq=next_seq(),
                span_id=self.span_id,
                parent_span_id=None if parent is None else parent.span_id,
                pid=process_id(),
                thread=thread.native_id,
                thread_name=thread.name,
                step=current_step(),
                rank=who[0],
                world_size=who[1],
                logger=logger.name,
                attrs=self.attrs.values.copy(),
                attrs_dropped=self.attrs.dropped,
            )
            if extra is not None:
                event.update(extra)
            record = logger.makeRecord(
                logger.name, level, spec.file, spec.line, event, (), None, spec.func
            )
            logger.handle(record)
        except Exception as exc:
            report_failure("sink_error", f"logging the events of {spec.name!r}", exc)

    def _span(self, start: int, end: int, status: str, error: dict[str, str] | None) -> None:
        args = self.attrs.values.copy()
        args["stepscope.span_id"] = self.span_id
        args["stepscope.status"] = status
        if error is not None:
            args["stepscope.error"] = f"{error['type']}: {error['message']}"
        try:
            trace_annotations.emit_span(self.spec.name, start, end, args)
        except Exception as exc:
            report_failure("sink_error", f"the trace span of {self.spec.name!r}", exc)
