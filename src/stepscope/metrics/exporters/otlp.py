"""OpenTelemetry: push through the SDK's OTLP exporter, or feed an SDK MeterProvider.

:class:`OtlpExporter` turns each snapshot into the SDK's ``MetricsData`` (cumulative sums,
gauges, explicit and exponential histograms) and hands it to an SDK ``MetricExporter``, by
default ``OTLPMetricExporter`` over HTTP/protobuf.  :class:`OtelMeterBridge` instead registers
observable instruments on a ``MeterProvider`` you already have, so stepscope's counters,
gauges and scalars show up through its readers (histograms cannot be observed that way and
are counted as skipped).  Both need the ``otlp`` extra.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from stepscope.extras import missing_extra, require
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.exporters.scalar_steps import with_step_families
from stepscope.metrics.failures import LOGGER
from stepscope.metrics.points import (
    ExpHistogramValue,
    ExportBatch,
    Family,
    HistogramValue,
    Labels,
    SummaryValue,
)
from stepscope.text import clean_text

try:
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Buckets,
        ExponentialHistogram,
        ExponentialHistogramDataPoint,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricExporter,
        MetricExportResult,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
except ImportError as exc:
    raise missing_extra("OtlpExporter and OtelMeterBridge", "otlp", f"{exc}") from exc

__all__ = ["OtelMeterBridge", "OtlpExporter", "to_metrics_data"]

_OTLP_HTTP = "opentelemetry.exporter.otlp.proto.http.metric_exporter"
_SCOPE = InstrumentationScope("stepscope.metrics", "0.1.0")
_CUMULATIVE = AggregationTemporality.CUMULATIVE


def _dense(pairs: Sequence[tuple[int, int]]) -> Buckets:
    if not pairs:
        return Buckets(offset=0, bucket_counts=[])
    low = pairs[0][0]
    counts = [0] * (pairs[-1][0] - low + 1)
    for index, n in pairs:
        counts[index - low] = n
    return Buckets(offset=low, bucket_counts=counts)


def _metrics(family: Family, start: int, now: int) -> Iterable[Metric]:
    name, doc, unit = clean_text(family.name), clean_text(family.description), family.unit

    def attrs(labels: Labels) -> dict[str, str]:
        return {k: clean_text(v) for k, v in labels}  # protobuf strings must be UTF-8

    if family.kind == "counter":
        points = [
            NumberDataPoint(attrs(p.labels), start, now, float(p.value))  # type: ignore[arg-type]
            for p in family.points
        ]
        yield Metric(name, doc, unit, Sum(points, _CUMULATIVE, True))
    elif family.kind == "histogram":
        hist_points = []
        for p in family.points:
            v = p.value
            if isinstance(v, HistogramValue):
                hist_points.append(
                    HistogramDataPoint(
                        attrs(p.labels),
                        start,
                        now,
                        v.count,
                        v.sum,
                        list(v.counts),
                        list(v.bounds),
                        v.min,
                        v.max,
                    )
                )
        yield Metric(name, doc, unit, Histogram(hist_points, _CUMULATIVE))
    elif family.kind == "exponential_histogram":
        exp_points = []
        for p in family.points:
            v = p.value
            if isinstance(v, ExpHistogramValue):
                exp_points.append(
                    ExponentialHistogramDataPoint(
                        attrs(p.labels),
                        start,
                        now,
                        v.count,
                        v.sum,
                        v.scale,
                        v.zero_count,
                        _dense(v.positive),
                        _dense(v.negative),
                        0,
                        v.min,
                        v.max,
                    )
                )
        yield Metric(name, doc, unit, ExponentialHistogram(exp_points, _CUMULATIVE))
    elif family.kind == "summary":
        sums, counts = [], []
        for p in family.points:
            v = p.value
            if isinstance(v, SummaryValue):
                sums.append(NumberDataPoint(attrs(p.labels), start, now, v.sum))
                counts.append(NumberDataPoint(attrs(p.labels), start, now, v.count))
        yield Metric(f"{name}.sum", doc, unit, Sum(sums, _CUMULATIVE, False))
        yield Metric(f"{name}.count", doc, "", Sum(counts, _CUMULATIVE, True))
    else:
        # a scalar's point (and its step's) is stamped with when its value was recorded
        points = [
            NumberDataPoint(
                attrs(p.labels),
                start,
                p.time_unix_ns or now,
                float(p.value),  # type: ignore[arg-type]
            )
            for p in family.points
        ]
        yield Metric(name, doc, unit, Gauge(points))


def to_metrics_data(batch: ExportBatch, resource: Resource) -> MetricsData:
    """The batch's snapshot as the SDK's ``MetricsData`` (cumulative since process start)."""
    metrics = [
        m
        for family in with_step_families(batch.families)
        for m in _metrics(family, batch.start_unix_ns, batch.time_unix_ns)
    ]
    scope = ScopeMetrics(_SCOPE, metrics, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


class OtlpExporter(Exporter):
    """Pushes snapshots through an SDK ``MetricExporter`` (default: OTLP over HTTP/protobuf).

    ``endpoint`` is the full metrics URL (e.g. ``http://collector:4318/v1/metrics``); left as
    None, the SDK reads ``OTEL_EXPORTER_OTLP_*`` environment variables.  ``timeout_s`` bounds
    one export including the SDK's own retries.
    """

    name = "otlp"

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        exporter: MetricExporter | None = None,
        headers: dict[str, str] | None = None,
        resource_attributes: dict[str, str] | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if exporter is None:  # checked now, not at the first export on the export thread
            require(_OTLP_HTTP, "OtlpExporter (OTLP over HTTP)", "otlp")
        self.endpoint = endpoint
        self.headers = headers
        self.timeout_s = timeout_s
        self._own_exporter = exporter is None
        self._exporter = exporter
        self._attributes = dict(resource_attributes or {})
        self._resource: Resource | None = None

    def _make_exporter(self) -> MetricExporter:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        # the SDK exporter retries within its own timeout, not the one passed to export()
        exporter: MetricExporter = OTLPMetricExporter(
            endpoint=self.endpoint, headers=self.headers, timeout=self.timeout_s
        )
        return exporter

    @property
    def resource(self) -> Resource:
        """The OpenTelemetry resource (service name, pid, your attributes)."""
        if self._resource is None:
            attributes: dict[str, Any] = {"service.name": "stepscope", "process.pid": os.getpid()}
            attributes.update(self._attributes)
            self._resource = Resource.create(attributes)
        return self._resource

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Send the snapshot; raise when the SDK exporter reports failure."""
        data = to_metrics_data(batch, self.resource)
        if self._exporter is None:
            self._exporter = self._make_exporter()
        result = self._exporter.export(data, timeout_millis=timeout_s * 1000)
        if result is not MetricExportResult.SUCCESS:
            raise OSError(f"OTLP export to {self.endpoint or 'the default endpoint'} failed")

    def after_fork_in_child(self) -> None:
        """A child gets its own HTTP session (made at its first export) and its pid."""
        if self._own_exporter:
            self._exporter = None
        self._resource = None

    def close(self) -> None:
        """Shut the SDK exporter down."""
        if self._exporter is not None:
            self._exporter.shutdown(timeout_millis=2000)


class OtelMeterBridge(Exporter):
    """Observable instruments on ``meter_provider`` that report the latest snapshot."""

    name = "otel-bridge"

    def __init__(self, meter_provider: Any) -> None:
        self.meter = meter_provider.get_meter("stepscope.metrics", "0.1.0")
        self._latest: dict[str, Family] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self.skipped: set[str] = set()

    def _observe(self, name: str) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                family = self._latest.get(name)
            if family is None:
                return []
            return [
                Observation(float(p.value), dict(p.labels))  # type: ignore[arg-type]
                for p in family.points
                if isinstance(p.value, (int, float))
            ]

        return callback

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Remember the snapshot and register instruments for new families."""
        families = with_step_families(batch.families)
        with self._lock:
            for family in families:
                self._latest[family.name] = family
        for family in families:
            if family.name in self._registered or family.name in self.skipped:
                continue
            callbacks = [self._observe(family.name)]
            if family.kind == "counter":
                self.meter.create_observable_counter(
                    family.name, callbacks, unit=family.unit, description=family.description
                )
            elif family.kind in ("gauge", "scalar"):
                self.meter.create_observable_gauge(
                    family.name, callbacks, unit=family.unit, description=family.description
                )
            else:
                self.skipped.add(family.name)
                LOGGER.warning(
                    "stepscope.metrics: %s %r cannot be observed through a MeterProvider; "
                    "use OtlpExporter for histograms",
                    family.kind,
                    family.name,
                )
                continue
            self._registered.add(family.name)
