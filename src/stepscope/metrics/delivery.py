"""Delivery to one exporter or channel sink: retries with backoff, then the spill file.

A failed delivery is retried ``retry.attempts`` times with doubling sleeps; then the batch's
records go to the target's spill file and the target is left alone (backing off, doubling up to
``retry.max_backoff_s``) while later batches spill straight away.  Each failed attempt is a
failure of the ``metrics`` area (``export_error`` for an exporter, ``sink_error`` for a channel
sink): counted, logged once per target, and under ``config.strict`` handed to the pipeline,
which re-raises it in the caller's thread at the next ``flush()`` or ``shutdown()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from stepscope.clock import now_ns
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.failures import LOGGER, report_failure
from stepscope.metrics.points import ExportBatch
from stepscope.metrics.ring import RecordSink
from stepscope.metrics.settings import PipelineSettings
from stepscope.metrics.spill import SpillFile

__all__ = ["Delivery", "DeliveryHost", "after_fork_quietly", "close_quietly"]

_NS = 1_000_000_000


class DeliveryHost(Protocol):
    """What a delivery needs from its pipeline."""

    @property
    def settings(self) -> PipelineSettings:
        """The pipeline's settings now."""

    @property
    def abandoned(self) -> bool:
        """Whether shutdown gave up on the export thread (its results are ignored)."""

    def remaining_s(self, final: bool) -> float:
        """Seconds one attempt may take now."""

    def defer_failure(self, exc: BaseException) -> None:
        """Keep a failure raised under strict for the caller's next flush or shutdown."""


class Delivery:
    """Delivery state of one exporter or channel sink: counts, backoff and its spill file."""

    def __init__(self, name: str, target: Exporter | RecordSink, spill: SpillFile) -> None:
        self.name = name
        self.target = target
        self.spill = spill
        self.offered = 0
        self.exported = 0
        self.spilled = 0
        self.dropped: dict[str, int] = {}
        self.failures = 0
        self.backoff_s = 0.0
        self.down_until_ns = 0
        # The newest failed attempt's error, for accounting() and the closing line: a target's
        # failures are logged once, so a later, different error shows only here.
        self.last_error = ""

    def drop(self, reason: str, n: int) -> None:
        """Count ``n`` records lost for ``reason``."""
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def reset_after_fork(self) -> None:
        """A forked child starts with nothing counted and its own spill file."""
        self.offered = self.exported = self.spilled = self.failures = 0
        self.dropped = {}
        self.backoff_s = 0.0
        self.down_until_ns = 0
        self.last_error = ""
        self.spill.after_fork_in_child()

    def _report(self, exc: Exception, host: DeliveryHost) -> None:
        sink = not isinstance(self.target, Exporter)
        kind, what = ("sink_error", "channel") if sink else ("export_error", "exporter")
        try:
            report_failure(
                kind,
                f"{what} {self.name!r}",
                exc,
                then="retrying with backoff, then spilling",
                once=(kind, id(self)),
            )
        except Exception as strict_exc:  # config.strict: the caller gets it at flush/shutdown
            host.defer_failure(strict_exc)

    def attempt(self, send: Callable[[float], None], host: DeliveryHost, final: bool) -> bool:
        """Call ``send(timeout_s)`` with retries; True when it succeeded."""
        now = now_ns()
        if now < self.down_until_ns and not final:
            return False
        retry = host.settings.retry
        attempts = 1 if (final and self.down_until_ns) else retry.attempts
        delay = retry.initial_backoff_s
        for attempt in range(attempts):
            timeout = host.remaining_s(final)
            if timeout <= 0:
                break
            try:
                send(timeout)
            except Exception as exc:
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._report(exc, host)
                if attempt + 1 < attempts:
                    time.sleep(min(delay, max(0.0, host.remaining_s(final))))
                    delay = min(delay * 2, retry.max_backoff_s)
                continue
            if self.down_until_ns:
                LOGGER.warning("stepscope.metrics: exporter %r recovered", self.name)
            self.backoff_s = 0.0
            self.down_until_ns = 0
            return True
        interval = host.settings.interval_s
        self.backoff_s = min(max(self.backoff_s * 2, interval), retry.max_backoff_s)
        self.down_until_ns = now_ns() + int(self.backoff_s * _NS)
        return False

    def export_batch(self, batch: ExportBatch, host: DeliveryHost, final: bool) -> None:
        """Deliver ``batch`` to the exporter, or spill its scalar points and records."""
        n = batch.record_count
        self.offered += n
        exporter = cast(Exporter, self.target)
        delivered = self.attempt(lambda timeout: exporter.export(batch, timeout), host, final)
        if host.abandoned:
            return
        if delivered:
            self.exported += n
            return
        entries: list[dict[str, Any]] = [
            {
                "kind": "scalar",
                "name": s.name,
                "labels": dict(s.labels),
                "step": s.step,
                "value": s.value,
                "count": s.count,
                "reduce": s.reduce,
                "time_unix_ns": s.time_unix_ns,
            }
            for s in batch.scalars
        ]
        entries.extend(
            {
                "kind": "record",
                "group": r.group,
                "name": r.name,
                "value": r.value,
                "time_unix_ns": r.time_unix_ns,
            }
            for r in batch.records
        )
        self.spill_entries(entries, n, host.settings.spill_max_bytes)

    def write_records(self, records: list[Any], host: DeliveryHost, final: bool) -> None:
        """Deliver a channel's ``records`` to its sink, or spill them."""
        n = len(records)
        self.offered += n
        sink = cast(RecordSink, self.target)
        delivered = self.attempt(lambda timeout: sink.write_records(records, timeout), host, final)
        if host.abandoned:
            return
        if delivered:
            self.exported += n
            return
        try:
            entries = [{"kind": "record", "data": sink.spill_form(r)} for r in records]
        except Exception:
            self.drop("unserialisable", n)
            return
        self.spill_entries(entries, n, host.settings.spill_max_bytes)

    def spill_entries(self, entries: list[dict[str, Any]], n: int, max_bytes: int) -> None:
        """Append ``entries`` (``n`` records) to the spill file, or count them as dropped."""
        if not n:
            return
        self.spill.max_bytes = max_bytes
        for entry in entries:
            entry["exporter"] = self.name
        reason = self.spill.write(entries)
        if reason is None:
            self.spilled += n
        else:
            self.drop(reason, n)


def close_quietly(target: Exporter | RecordSink) -> None:
    """Close an exporter or sink; a failure is reported (``exporter_error``), not raised."""
    try:
        target.close()
    except Exception as exc:
        report_failure("exporter_error", f"{type(target).__name__}.close", exc)


def after_fork_quietly(target: Exporter | RecordSink) -> None:
    """Let an exporter or sink reopen per-process resources in a forked child."""
    try:
        target.after_fork_in_child()
    except Exception as exc:
        report_failure(
            "exporter_error", f"{type(target).__name__}.after_fork_in_child", exc, strict=False
        )
