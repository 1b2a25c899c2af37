"""Failures inside instruments, handlers and exporters: counted, logged once, never raised.

A failure inside stepscope's metrics must not break the user's program.  Each failure is counted
in the pipeline's self-telemetry and logged once per ``key``; ``set_strict(True)`` (for tests)
re-raises instead.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["LOGGER", "is_strict", "report_failure", "set_strict"]

LOGGER = logging.getLogger("stepscope.metrics")

_strict = False
_logged: set[str] = set()
_lock = threading.Lock()
_counts: dict[str, int] = {}


def set_strict(strict: bool) -> None:
    """Re-raise failures inside instruments, handlers and exporters instead of counting them."""
    global _strict
    _strict = bool(strict)


def is_strict() -> bool:
    """Whether failures are re-raised (see :func:`set_strict`)."""
    return _strict


def report_failure(kind: str, key: str, exc: BaseException) -> None:
    """Count a failure of ``kind`` and log it once per ``key``; re-raise in strict mode."""
    with _lock:
        _counts[kind] = _counts.get(kind, 0) + 1
        first = key not in _logged
        if first:
            _logged.add(key)
    if _strict:
        raise exc
    if first:
        LOGGER.warning(
            "stepscope.metrics: %s in %s: %s: %s (counted; further ones are not logged)",
            kind.replace("_", " "),
            key,
            type(exc).__name__,
            exc,
        )


def failure_counts() -> dict[str, int]:
    """How many failures of each kind were reported in this process."""
    with _lock:
        return dict(_counts)


def reset_after_fork() -> None:
    """Give a forked child its own lock and zero counts."""
    global _lock
    _lock = threading.Lock()
    _counts.clear()
