"""The pipeline's accounting and self-telemetry: nothing is lost silently.

:class:`Tally` counts the records the pipeline accepted and the ones it dropped before any
exporter saw them; with the ring's drop counts and each :class:`~stepscope.metrics.delivery.
Delivery`'s counts that gives, per exporter, ``exported + spilled + dropped == produced`` after
shutdown.  The same numbers are exported as ``stepscope.metrics.*`` series, and shutdown logs
one line when anything was dropped or spilled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from stepscope.metrics.delivery import Delivery
from stepscope.metrics.failures import LOGGER, failure_counts
from stepscope.metrics.points import Family, SeriesPoint
from stepscope.metrics.ring import RECORDS, Channel, Ring

__all__ = ["Tally", "closing_line", "telemetry_families"]


class Tally:
    """Records accepted and dropped by the pipeline itself (before any exporter)."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.accepted = 0
        self.dropped: dict[str, int] = {}
        self.cycles = 0

    def drop(self, reason: str, n: int) -> None:
        """Count ``n`` records lost for ``reason`` before any exporter saw them."""
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def reset(self) -> None:
        """Nothing counted (a forked child)."""
        self.accepted = 0
        self.dropped = {}
        self.cycles = 0

    def produced(self) -> int:
        """Records (scalar samples and torchelastic API values) offered to the pipeline."""
        return self.accepted + self.ring.dropped(RECORDS)

    def accounting(self, deliveries: Iterable[Delivery]) -> dict[str, dict[str, Any]]:
        """Per exporter: produced, exported, spilled and dropped records (by reason), failed
        attempts and the last one's error."""
        pipeline_dropped = dict(self.dropped)
        ring_dropped = self.ring.dropped(RECORDS)
        if ring_dropped:
            pipeline_dropped["ring_full"] = ring_dropped
        produced = self.produced()
        out = {}
        for d in list(deliveries):
            reasons = dict(pipeline_dropped)
            for reason, n in d.dropped.items():
                reasons[reason] = reasons.get(reason, 0) + n
            out[d.name] = {
                "produced": produced,
                "offered": d.offered,
                "exported": d.exported,
                "spilled": d.spilled,
                "dropped": sum(reasons.values()),
                "dropped_by_reason": reasons,
                "export_failures": d.failures,
                "last_error": d.last_error or None,
                "spill_file": str(d.spill.path) if d.spilled else None,
            }
        return out

    def channels(
        self, channels: Mapping[str, tuple[Channel, Delivery]]
    ) -> dict[str, dict[str, Any]]:
        """Per channel: offered, exported, spilled and dropped records (by reason)."""
        out = {}
        for name, (channel, d) in list(channels.items()):
            reasons = dict(d.dropped)
            ring = self.ring.dropped(channel.drop_key)
            if ring:
                reasons["ring_full"] = ring
            out[name] = {
                "offered": d.offered,
                "exported": d.exported,
                "spilled": d.spilled,
                "dropped": sum(reasons.values()),
                "dropped_by_reason": reasons,
            }
        return out

    def telemetry(
        self,
        deliveries: Iterable[Delivery],
        channels: Mapping[str, tuple[Channel, Delivery]],
        overflowed_label_sets: Any,
    ) -> dict[str, Any]:
        """Produced/exported/spilled/dropped, errors, queue depth, channels."""
        failures = failure_counts()
        return {
            "produced": self.produced(),
            "queue_depth": len(self.ring),
            "ring_capacity": self.ring.capacity,
            "dropped_at_ring": self.ring.dropped(),
            "handler_errors": failures.get("handler_error", 0),
            "failures": failures,
            "overflowed_label_sets": overflowed_label_sets,
            "cycles": self.cycles,
            "exporters": self.accounting(deliveries),
            "channels": self.channels(channels),
        }


def telemetry_families(
    acc: dict[str, dict[str, Any]], produced: int, queue_depth: int, step: int | None
) -> list[Family]:
    """The self-telemetry as ``stepscope.metrics.*`` series, and the ``stepscope.step`` gauge."""
    failures = failure_counts()
    dropped: list[SeriesPoint] = []
    for name, a in acc.items():
        for reason, n in a["dropped_by_reason"].items():
            dropped.append(SeriesPoint((("exporter", name), ("reason", reason)), float(n)))

    def per_exporter(key: str) -> tuple[SeriesPoint, ...]:
        return tuple(SeriesPoint((("exporter", n),), float(a[key])) for n, a in acc.items())

    families = [
        Family(
            "stepscope.metrics.records_produced",
            "counter",
            "records (scalar samples, put_metric values) offered to the pipeline",
            "",
            (SeriesPoint((), float(produced)),),
        ),
        Family(
            "stepscope.metrics.records_exported",
            "counter",
            "records delivered, per exporter",
            "",
            per_exporter("exported"),
        ),
        Family(
            "stepscope.metrics.records_spilled",
            "counter",
            "records written to the spill file, per exporter",
            "",
            per_exporter("spilled"),
        ),
        Family(
            "stepscope.metrics.records_dropped",
            "counter",
            "records lost, per exporter and reason",
            "",
            tuple(dropped),
        ),
        Family(
            "stepscope.metrics.export_failures",
            "counter",
            "failed delivery attempts, per exporter",
            "",
            per_exporter("export_failures"),
        ),
        Family(
            "stepscope.metrics.handler_errors",
            "counter",
            "exceptions raised by torchelastic API handlers",
            "",
            (SeriesPoint((), float(failures.get("handler_error", 0))),),
        ),
        Family(
            "stepscope.metrics.queue_depth",
            "gauge",
            "items waiting in the ring",
            "",
            (SeriesPoint((), float(queue_depth)),),
            "sum",
        ),
    ]
    if step is not None:
        families.append(
            Family(
                "stepscope.step",
                "gauge",
                "the shared step counter",
                "",
                (SeriesPoint((), float(step)),),
                "max",
            )
        )
    return [f for f in families if f.points]


def closing_line(
    acc: dict[str, dict[str, Any]], channels: dict[str, dict[str, Any]], produced: int
) -> None:
    """Log one line when anything was dropped or spilled (at shutdown)."""
    spilled = sum(a["spilled"] for a in acc.values())
    dropped = max((a["dropped"] for a in acc.values()), default=0)
    channel_drops = sum(c["dropped"] + c["spilled"] for c in channels.values())
    if not (spilled or dropped or channel_drops):
        return
    parts = []
    for name, a in acc.items():
        if a["dropped"] or a["spilled"]:
            reasons = ", ".join(f"{r}={n}" for r, n in sorted(a["dropped_by_reason"].items()))
            where = f" to {a['spill_file']}" if a["spill_file"] else ""
            why = f"; last error: {a['last_error']}" if a["last_error"] else ""
            parts.append(
                f"{name}: {a['exported']} exported, {a['spilled']} spilled{where}, "
                f"{a['dropped']} dropped ({reasons or 'none'}{why})"
            )
    if channel_drops:
        parts.append(f"channels: {channel_drops} records dropped or spilled")
    LOGGER.warning("stepscope.metrics: of %d records, %s", produced, "; ".join(parts))
