"""The one failure policy: count it, log it once, re-raise only under ``config.strict``.

Every part that runs inside the user's program (collectors, trace handlers, instruments,
exporters, channel sinks, event logging, metric tables, the function profiler) reports its
failures to the :class:`FailureLog` of its *area* (``failure_log("metrics")`` ...): a failure
there must not break the program, must not be silent, and must not flood the log.

- **Count**: ``failure_counts()`` gathers every area: ``{area: {kind: n}}``.
- **Log once**: the first failure of each place is logged at WARNING on the logger
  ``stepscope.failures.<area>``, never on a logger the user's own events go to.
- **Re-raise when strict**: ``stepscope.config.config.strict = True`` (for tests) is the one
  switch; :func:`is_strict` reads it.  A component built with its own ``strict=`` (a profile,
  a collector) passes that value as ``strict=`` to :meth:`FailureLog.report`; ``None`` follows
  the switch.
- **The program's own exception goes on**: one raised by the program's Python signal handler
  while stepscope's code happened to run (a SIGALRM timeout) is no failure of stepscope's: it
  is re-raised, never counted (:func:`raised_by_program_signal_handler`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import traceback
from collections.abc import Hashable

from stepscope.config import config
from stepscope.forks import after_fork_in_child

__all__ = [
    "FailureLog",
    "failure_counts",
    "failure_log",
    "is_strict",
    "raised_by_program_signal_handler",
    "set_strict",
]


def is_strict(override: bool | None = None) -> bool:
    """Whether failures are re-raised: ``override`` when given, else ``config.strict``."""
    return config.strict if override is None else bool(override)


def set_strict(strict: bool) -> None:
    """Set the one switch, ``config.strict`` (re-raise failures inside instruments; for tests)."""
    config.strict = bool(strict)


class FailureLog:
    """Counts the failures of one area by kind and logs the first one of each place."""

    def __init__(self, area: str) -> None:
        if not isinstance(area, str) or not area or "." in area:
            raise ValueError(f"a failure area is a non-empty name without dots, got {area!r}")
        self.area = area
        self.logger = logging.getLogger(f"stepscope.failures.{area}")
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._logged: set[Hashable] = set()

    def __repr__(self) -> str:
        return f"FailureLog({self.area!r}, {self.counts()!r})"

    def report(
        self,
        kind: str,
        where: str,
        exc: BaseException,
        *,
        strict: bool | None = None,
        then: str = "",
        once: Hashable | None = None,
        message: str = "",
    ) -> None:
        """Count a failure of ``kind`` at ``where``; log it the first time; re-raise if strict
        (or when it is the program's own, from its signal handler: never counted).

        ``message`` says what failed in words (default ``"<kind> in <where>"``), ``then`` what
        happens next; ``once`` is what "the first time" is counted by (default ``where``);
        ``strict`` overrides ``config.strict`` for this one report.
        """
        if raised_by_program_signal_handler(exc):
            raise exc  # the program's own exception, landed while stepscope's code ran
        key = where if once is None else once
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            first = key not in self._logged
            self._logged.add(key)
        if is_strict(strict):
            raise exc
        if first:
            # the failing piece may be a handler of a logger this one propagates to
            with contextlib.suppress(Exception):
                self.logger.warning(
                    "stepscope.%s: %s: %s: %s%s (counted; later ones are not logged)",
                    self.area,
                    message or f"{kind.replace('_', ' ')} in {where}",
                    type(exc).__name__,
                    exc,
                    f"; {then}" if then else "",
                )

    def counts(self) -> dict[str, int]:
        """How many failures of each kind were reported in this process."""
        with self._lock:
            return dict(self._counts)

    def reset_in_child(self) -> None:
        """Give a forked child its own lock and nothing counted or logged yet."""
        self._lock = threading.Lock()
        self._counts.clear()
        self._logged.clear()


_logs: dict[str, FailureLog] = {}
_logs_lock = threading.Lock()


def failure_log(area: str) -> FailureLog:
    """The failure log of ``area`` (``collectors``, ``handlers``, ``metrics``, ``events``, ...)."""
    found = _logs.get(area)
    if found is None:
        with _logs_lock:
            found = _logs.get(area)
            if found is None:
                found = _logs[area] = FailureLog(area)
    return found


def failure_counts() -> dict[str, dict[str, int]]:
    """Failures counted in this process, by area and kind: ``{area: {kind: n}}``."""
    with _logs_lock:
        logs = sorted(_logs.items())
    return {area: log.counts() for area, log in logs}


def _reset_in_child() -> None:
    global _logs_lock
    _logs_lock = threading.Lock()
    for log in list(_logs.values()):
        log.reset_in_child()


after_fork_in_child(_reset_in_child)


def raised_by_program_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a Python signal handler of the program's (one installed now,
    not stepscope's), run while stepscope's code happened to be running: the program's own
    exception (a SIGALRM timeout...), to go on as it would without stepscope, never a failure of
    stepscope's to count and swallow."""
    handlers = set()
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except (ValueError, OSError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None and not str(getattr(handler, "__module__", "")).startswith(
            "stepscope."
        ):
            handlers.add(code)
    return bool(handlers) and any(
        frame.f_code in handlers for frame, _ in traceback.walk_tb(exc.__traceback__)
    )
