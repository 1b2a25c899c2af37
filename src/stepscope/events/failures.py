"""Failures inside the event logger (an extractor, a sink): counted, logged once, never raised.

``stepscope.config.strict = True`` (for tests) re-raises instead.
"""

from __future__ import annotations

import logging
import os

from stepscope.config import config
from stepscope.failures import FailureLog

__all__ = ["failure_counts", "report_failure"]

_log = FailureLog(
    "stepscope.events", logging.getLogger("stepscope.events.failures"), lambda: config.strict
)
report_failure = _log.report
failure_counts = _log.counts

os.register_at_fork(after_in_child=_log.reset_in_child)
