"""A profile's part in what ranks agree on: step numbers at start, clocks at the first window.

Thin and failure-proof: every call into ``stepscope.distributed`` is guarded, a failure is
reported to the ``collectors`` failure log (raised only under ``strict``) and profiling goes on
with this rank's own step numbers or unaligned clocks.
"""

from __future__ import annotations

from typing import Any

from stepscope.distributed import StepBeacon, join_steps, sync_first_window
from stepscope.failures import failure_log

__all__ = ["RankSync"]

_failures = failure_log("collectors")


class RankSync:
    """Joins the step leader's numbering, publishes steps when leading, syncs clocks once."""

    def __init__(self, strict: bool | None) -> None:
        self.strict = strict
        self.beacon: StepBeacon | None = None
        self.record: dict[str, Any] | None = None
        """The ``stepscope_rank_sync`` record of the first window (None: not a multi-rank job)."""
        self._synced = False

    def join(self, step: int) -> int:
        """The step number to start at (``distributed.join_steps``); ``step`` on failure."""
        try:
            self.beacon, joined = join_steps(step)
        except Exception as exc:
            _failures.report(
                "rank_steps_error", "join_steps", exc, strict=self.strict,
                then="this rank keeps its own step numbers",
            )  # fmt: skip
            return step
        return joined

    def publish(self, step: int) -> None:
        """Publish a step boundary when this rank leads the step numbers."""
        self._beacon_call("publish", step)

    def close(self) -> None:
        """The profile stopped: a leading rank says so (later ranks stop waiting for it)."""
        self._beacon_call("close")
        self.beacon = None

    def _beacon_call(self, method: str, *args: int) -> None:
        if self.beacon is None:
            return
        try:
            getattr(self.beacon, method)(*args)
        except Exception as exc:
            _failures.report("rank_steps_error", f"StepBeacon.{method}", exc, strict=self.strict)
            self.beacon = None

    def first_window_end(self, first_step: int, last_step: int) -> dict[str, Any] | None:
        """The clock handshake, once per profile (``distributed.sync_first_window``)."""
        if self._synced:
            return self.record
        self._synced = True
        try:
            self.record = sync_first_window(first_step, last_step)
        except Exception as exc:
            _failures.report(
                "rank_sync_error", "sync_first_window", exc, strict=self.strict,
                then="clocks are not aligned",
            )  # fmt: skip
            self.record = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        return self.record
