"""A collector hook's failure, handled so that it never breaks the program.

A failure is counted and logged once (raised only under ``strict``), and switches the collector
off for the window; the program's own exception — raised by its Python signal handler while the
hook happened to run — goes on as it would without stepscope (``FailureLog.report`` tells).
"""

from __future__ import annotations

from stepscope.collectors.base import Collector, WindowContext
from stepscope.failures import failure_log

__all__ = ["collector_failed"]

_failures = failure_log("collectors")


def collector_failed(
    collector: Collector,
    phase: str,
    exc: Exception,
    broken: set[int],
    ctx: WindowContext | None,
    strict: bool | None,
    owner: int,
) -> None:
    """``collector``'s ``phase`` hook raised ``exc``: count and log it (raise it under
    ``strict``, or when it is the program's own), switch the collector off for the window
    (``broken``) and name the error in the window's metadata."""
    _failures.report(
        "collector_error",
        f"collector {collector.name!r} in {phase}",
        exc,
        strict=strict,
        then="it is off for this window",
        once=(owner, collector.name, phase),
    )
    broken.add(id(collector))
    if ctx is not None:
        errors = ctx.metadata.setdefault("stepscope_collector_errors", {})
        errors[f"{collector.name}.{phase}"] = f"{type(exc).__name__}: {exc}"
