"""Failures inside instruments, handlers and exporters: the ``metrics`` area of the failure policy.

A failure inside stepscope's metrics must not break the user's program.  Each failure is counted
(``failure_counts()``, also the pipeline's self-telemetry) and logged once per place on
``stepscope.failures.metrics``; under ``config.strict`` (``set_strict(True)`` sets it) it is
re-raised instead.  See :mod:`stepscope.failures`.
"""

from __future__ import annotations

import logging

from stepscope.failures import failure_log

__all__ = ["LOGGER", "failure_counts", "report_failure"]

LOGGER = logging.getLogger("stepscope.metrics")
"""The pipeline's own messages (an exporter recovered, the closing line); failures go to
``stepscope.failures.metrics``."""

_log = failure_log("metrics")
report_failure = _log.report
failure_counts = _log.counts
