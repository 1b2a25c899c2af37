"""Failures inside instruments: counted, logged once per place, never raised (unless strict).

Every part that runs inside the user's program (metrics, events, collectors) keeps one
``FailureLog``: a failure there must not break the program, must not be silent, and must not
flood the log.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

__all__ = ["FailureLog"]


class FailureLog:
    """Counts failures by kind and logs the first one of each place."""

    def __init__(self, area: str, logger: logging.Logger, strict: Callable[[], bool]) -> None:
        self.area = area
        self.logger = logger
        self._strict = strict
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._logged: set[str] = set()

    def report(self, kind: str, where: str, exc: BaseException) -> None:
        """Count a failure of ``kind`` at ``where``; log it the first time; re-raise if strict."""
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            first = where not in self._logged
            self._logged.add(where)
        if self._strict():
            raise exc
        if first:
            # the failing piece may be a handler of this very logger
            with contextlib.suppress(Exception):
                self.logger.warning(
                    "%s: %s in %s: %s: %s (counted; later ones are not logged)",
                    self.area,
                    kind.replace("_", " "),
                    where,
                    type(exc).__name__,
                    exc,
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
