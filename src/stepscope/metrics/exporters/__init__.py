"""Exporters: where the export thread sends each batch.

JSONL, CSV, console, logging, seed-API handlers and StatsD need nothing extra; Prometheus needs
``prometheus_client`` (extra ``prometheus``) and OTLP the OpenTelemetry SDK (extra ``otlp``), so
those are imported when first used; without them, constructing one raises
:class:`~stepscope.extras.MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from stepscope.extras import MissingExtraError, unavailable_class
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

_LAZY = {
    "PrometheusEndpoint": "stepscope.metrics.exporters.prometheus",
    "PushgatewayExporter": "stepscope.metrics.exporters.prometheus",
    "OtlpExporter": "stepscope.metrics.exporters.otlp",
    "OtelMeterBridge": "stepscope.metrics.exporters.otlp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except MissingExtraError as exc:  # importable; constructing it says which extra to install
        return unavailable_class(name, exc)
