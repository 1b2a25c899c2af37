"""Failures inside instruments, handlers and exporters: counted, logged once, never raised.

A failure inside stepscope's metrics must not break the user's program.  Each failure is counted
in the pipeline's self-telemetry and logged once per ``key``; ``set_strict(True)`` (for tests)
re-raises instead.
"""

from __future__ import annotations

import logging

from stepscope.failures import FailureLog

__all__ = ["LOGGER", "failure_counts", "is_strict", "report_failure", "set_strict"]

LOGGER = logging.getLogger("stepscope.metrics")

_strict = False


def set_strict(strict: bool) -> None:
    """Re-raise failures inside instruments, handlers and exporters instead of counting them."""
    global _strict
    _strict = bool(strict)


def is_strict() -> bool:
    """Whether failures are re-raised (see :func:`set_strict`)."""
    return _strict


_log = FailureLog("stepscope.metrics", LOGGER, is_strict)
report_failure = _log.report
failure_counts = _log.counts
reset_after_fork = _log.reset_in_child
