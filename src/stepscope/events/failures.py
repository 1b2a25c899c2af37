"""Failures inside the event logger (an extractor, a sink): counted, logged once, never raised.

``stepscope.config.strict = True`` (for tests) re-raises instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from stepscope.config import config

__all__ = ["failure_counts", "report_failure"]

LOGGER = logging.getLogger("stepscope.events.failures")

_lock = threading.Lock()
_counts: dict[str, int] = {}
_logged: set[str] = set()


def report_failure(kind: str, where: str, exc: Exception) -> None:
    """Count a failure of ``kind`` at ``where`` and log it once per place; re-raise if strict."""
    with _lock:
        _counts[kind] = _counts.get(kind, 0) + 1
        first = where not in _logged
        _logged.add(where)
    if config.strict:
        raise exc
    if first:
        # the failing piece may be a handler of this very logger
        with contextlib.suppress(Exception):
            LOGGER.warning(
                "stepscope.events: %s in %s: %s: %s (counted; later ones are not logged)",
                kind.replace("_", " "),
                where,
                type(exc).__name__,
                exc,
            )


def failure_counts() -> dict[str, int]:
    """How many failures of each kind (``extractor_error``, ``sink_error`` ...) happened."""
    with _lock:
        return dict(_counts)


def _reset_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _counts.clear()
    _logged.clear()


os.register_at_fork(after_in_child=_reset_in_child)
