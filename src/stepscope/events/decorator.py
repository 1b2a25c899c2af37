"""``logged``: the decorator (and context manager) that records a call's start, end or exception.

When the logger is disabled for the level and no profiler window records, a decorated call only
reads two flags before calling through (see :mod:`stepscope.events.wrappers`); nothing else,
not even the rank, is computed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar, cast

from stepscope.events.call import Call, Spec
from stepscope.events.coerce import AttrSet
from stepscope.events.extractors import bind_static, make_binder, parse_fields
from stepscope.events.wrappers import wrap

__all__ = ["EVENTS_LOGGER", "Logged", "NoCall", "logged", "resolve_logger"]

F = TypeVar("F", bound=Callable[..., Any])

EVENTS_LOGGER = "stepscope.events"
"""The logger events go to unless ``logger=`` names another."""


def _level(level: int | str) -> int:
    if isinstance(level, bool) or not isinstance(level, (int, str)):
        raise TypeError(f"level must be a logging level (int or name), got {level!r}")
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise ValueError(f"unknown logging level name {level!r}; use e.g. 'DEBUG' or 'INFO'")
        return value
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    return level


def resolve_logger(logger: logging.Logger | str | None) -> logging.Logger:
    """The logger named (or given), or the ``stepscope.events`` logger for None."""
    if logger is None:
        return logging.getLogger(EVENTS_LOGGER)
    if isinstance(logger, str):
        return logging.getLogger(logger)
    if isinstance(logger, logging.Logger):
        return logger
    raise TypeError(f"logger must be a logging.Logger, a logger name or None, got {logger!r}")


class Logged:
    """A configured event logger: decorate functions with it, or use it in ``with``."""

    __slots__ = (
        "_open",
        "_spec",
        "extractors",
        "level",
        "log_exceptions",
        "logger",
        "name",
        "static",
    )

    def __init__(
        self,
        name: str | None = None,
        *,
        log_exceptions: bool = False,
        level: int | str = logging.INFO,
        fields: Any = None,
        logger: logging.Logger | str | None = None,
        **static: Any,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"the event name must be a non-empty str or None, got {name!r}")
        if not isinstance(log_exceptions, bool):
            raise TypeError(f"log_exceptions must be a bool, got {log_exceptions!r}")
        self.name = name
        self.log_exceptions = log_exceptions
        self.level = _level(level)
        self.logger = resolve_logger(logger)
        self.extractors = parse_fields(fields)
        self.static = static
        self._spec: Spec | None = None
        self._open: ContextVar[tuple[Call | None, Any]] | None = None

    def _make_spec(self, name: str, fn: Callable[..., Any] | None) -> Spec:
        static = AttrSet()
        for key, value in self.static.items():
            static.add(key, value)
        binder = None
        if self.extractors:
            if fn is None:
                binder, known = bind_static(self.static), set(self.static)
            else:
                binder, known = make_binder(fn, self.static)
            missing = [e.arg for e in self.extractors if e.arg is not None and e.arg not in known]
            if missing and "*" not in known:
                raise ValueError(
                    f"fields name arguments {missing} that {name!r} does not take; "
                    f"it takes {sorted(known - {'*'})}"
                )
        if fn is not None:
            code = getattr(fn, "__code__", None)
            where = (
                getattr(code, "co_filename", "(unknown file)"),
                getattr(code, "co_firstlineno", 0),
                getattr(fn, "__name__", None),
            )
        else:
            where = ("(unknown file)", 0, None)
        return Spec(
            name,
            self.level,
            self.log_exceptions,
            self.logger,
            self.extractors,
            binder,
            static,
            where,
        )

    # -- decorator ------------------------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Wrap ``fn`` (function, method, async function, generator or async generator)."""
        if isinstance(fn, (staticmethod, classmethod)):
            return cast(F, type(fn)(self(fn.__func__)))
        if inspect.isclass(fn) or not callable(fn):
            raise TypeError(f"logged() decorates functions and methods, got {fn!r}")
        name = self.name or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        return cast(F, wrap(fn, self._make_spec(name, fn)))

    # -- context manager ------------------------------------------------------------------------

    def _cm_spec(self) -> Spec:
        spec = self._spec
        if spec is None:
            if self.name is None:
                raise TypeError("logged() used as a context manager needs a name: logged('load')")
            spec = self._spec = self._make_spec(self.name, None)
        return spec

    def __enter__(self) -> Call | NoCall:
        spec = self._cm_spec()
        opened = self._open
        if opened is None:
            opened = self._open = ContextVar(f"stepscope_logged_{id(self)}")
        call = spec.begin((), {})
        opened.set((call, opened.get(None)))
        return NO_CALL if call is None else call

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        opened = self._open
        top = None if opened is None else opened.get(None)
        if opened is None or top is None:
            raise RuntimeError("logged(...).__exit__ without a matching __enter__ in this context")
        call, below = top
        opened.set(below)
        if call is None:
            if exc is not None and self.log_exceptions:
                self._cm_spec().late_exception((), {}, exc)
            return
        if exc is None:
            call.finish()
        else:
            call.fail(exc)

    async def __aenter__(self) -> Call | NoCall:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


class NoCall:
    """What ``with logged(...) as call`` yields when nothing is recorded: accepts and ignores."""

    __slots__ = ()
    span_id = None

    def set(self, name: str, value: Any) -> bool:
        """Ignored (nothing is recorded)."""
        return False


NO_CALL = NoCall()


def logged(
    name: str | None = None,
    *,
    log_exceptions: bool = False,
    level: int | str = logging.INFO,
    fields: Any = None,
    logger: logging.Logger | str | None = None,
    **static: Any,
) -> Logged:
    """Record ``start`` / ``end`` / ``exception`` events of calls (decorator or ``with`` block).

    ``name`` defaults to the function's ``module.qualname``.  ``level`` is the level of
    ``start``/``end`` events; exceptions are logged at ``ERROR`` when ``log_exceptions`` (even
    if ``level`` is disabled), else at ``level``.  ``fields`` extracts attributes from the
    call's arguments (see :mod:`stepscope.events.extractors`); ``static`` values are attributes
    of every event and arguments the extractors can read.
    """
    return Logged(
        name, log_exceptions=log_exceptions, level=level, fields=fields, logger=logger, **static
    )
