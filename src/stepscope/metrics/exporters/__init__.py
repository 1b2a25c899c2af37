"""Exporters: where the export thread sends each batch.

JSONL, CSV, console, logging, seed-API handlers and StatsD need nothing extra; Prometheus needs
``prometheus_client`` (extra ``prometheus``) and OTLP the OpenTelemetry SDK (extra ``otlp``), so
those are imported when first used; without them, constructing one raises
:class:`~stepscope.extras.MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

from stepscope.lazy import lazy_names
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.exporters.console import ConsoleExporter, HandlerExporter, LoggingExporter
from stepscope.metrics.exporters.files import CsvExporter, JsonlExporter
from stepscope.metrics.exporters.statsd import StatsdExporter

__all__ = [
    "ConsoleExporter",
    "CsvExporter",
    "Exporter",
    "HandlerExporter",
    "JsonlExporter",
    "LoggingExporter",
    "OtelMeterBridge",
    "OtlpExporter",
    "PrometheusEndpoint",
    "PushgatewayExporter",
    "StatsdExporter",
]

EXTRA_EXPORTERS = {
    "PrometheusEndpoint": "stepscope.metrics.exporters.prometheus",
    "PushgatewayExporter": "stepscope.metrics.exporters.prometheus",
    "OtlpExporter": "stepscope.metrics.exporters.otlp",
    "OtelMeterBridge": "stepscope.metrics.exporters.otlp",
}
"""The exporters that need an extra, each with its module: imported on first use."""

__getattr__, __dir__ = lazy_names(globals(), EXTRA_EXPORTERS, stand_in_for_missing_extra=True)
