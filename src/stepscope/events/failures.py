"""Failures inside the event logger (an extractor, a sink): the ``events`` area of the policy.

Counted, logged once per place on ``stepscope.failures.events`` (never on ``stepscope.events``,
whose handlers are the user's event stream), re-raised under ``config.strict``.  See
:mod:`stepscope.failures`.
"""

from __future__ import annotations

from stepscope.failures import failure_log

__all__ = ["failure_counts", "report_failure"]

_log = failure_log("events")
report_failure = _log.report
failure_counts = _log.counts
