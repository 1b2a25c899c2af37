"""A collector hook run so that its failure never breaks the program.

A failure is counted and logged once (raised only under ``strict``), and switches the collector
off for the window; the program's own exception — raised by its Python signal handler while the
hook happened to run — goes on as it would without stepscope (``FailureLog.report`` tells).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from stepscope.collectors.base import Collector
from stepscope.failures import failure_log
from stepscope.step_times import StepTimes

__all__ = ["run_guarded"]

_failures = failure_log("collectors")


def run_guarded(
    step_times: StepTimes,
    collector: Collector,
    phase: str,
    fn: Callable[[], Any],
    broken: set[int],
    metadata: MutableMapping[str, Any] | None,
    strict: bool | None,
    owner: int,
    suffix: str = "",
) -> None:
    """Run ``fn`` (``collector``'s ``phase`` hook) timed under its name (+ ``suffix``); on a
    failure of its own the collector joins ``broken`` and ``metadata`` names the error."""
    if id(collector) in broken and phase != "close":
        return
    try:
        step_times.timed(collector.name + suffix, fn)
    except Exception as exc:
        _failures.report(
            "collector_error",
            f"collector {collector.name!r} in {phase}",
            exc,
            strict=strict,
            then="it is off for this window",
            once=(owner, collector.name, phase),
        )
        broken.add(id(collector))
        if metadata is not None:
            errors = metadata.setdefault("stepscope_collector_errors", {})
            errors[f"{collector.name}.{phase}"] = f"{type(exc).__name__}: {exc}"
