"""stepscope.metrics: the torchelastic metrics API on a pipeline that never blocks the loop.

The seed-compatible names (``put_metric``, ``@prof``, ``configure``, handlers ...) behave as in
``torch.distributed.elastic.metrics``.  New code uses instruments (``counter``, ``gauge``,
``histogram``, ``scalar``) and exporters (``add_exporter(PrometheusEndpoint())`` ...)::

    from stepscope import metrics
    metrics.add_exporter(metrics.PrometheusEndpoint(port=9464))
    ...
    metrics.scalar("loss").record(loss)        # inside the loop; step from stepscope.steps
"""

from __future__ import annotations

from stepscope.failures import set_strict
from stepscope.lazy import lazy_names
from stepscope.metrics.api import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    NullMetricHandler,
    configure,
    get_elapsed_time_ms,
    getStream,
    prof,
    publish_metric,
    put_metric,
)
from stepscope.metrics.api import (
    profile as profile,  # torchelastic's deprecated decorator: reachable, not in __all__
)
from stepscope.metrics.api_adapter import PipelineMetricHandler
from stepscope.metrics.default import (
    add_exporter,
    configure_pipeline,
    counter,
    flush,
    gauge,
    get_pipeline,
    histogram,
    open_channel,
    remove_exporter,
    scalar,
    shutdown,
    telemetry,
)
from stepscope.metrics.exporters import (
    EXTRA_EXPORTERS,
    ConsoleExporter,
    CsvExporter,
    Exporter,
    HandlerExporter,
    JsonlExporter,
    LoggingExporter,
    StatsdExporter,
)
from stepscope.metrics.instruments import Counter, Gauge, Histogram
from stepscope.metrics.pipeline import Pipeline
from stepscope.metrics.ring import Channel, RecordSink
from stepscope.metrics.scalars import Scalar
from stepscope.metrics.settings import PipelineSettings, RetryPolicy

__all__ = [
    "Channel",
    "ConsoleExporter",
    "ConsoleMetricHandler",
    "Counter",
    "CsvExporter",
    "Exporter",
    "Gauge",
    "HandlerExporter",
    "Histogram",
    "JsonlExporter",
    "LoggingExporter",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "OtelMeterBridge",
    "OtlpExporter",
    "Pipeline",
    "PipelineMetricHandler",
    "PipelineSettings",
    "PrometheusEndpoint",
    "PushgatewayExporter",
    "RecordSink",
    "RetryPolicy",
    "Scalar",
    "StatsdExporter",
    "add_exporter",
    "configure",
    "configure_pipeline",
    "counter",
    "flush",
    "gauge",
    "getStream",
    "get_elapsed_time_ms",
    "get_pipeline",
    "histogram",
    "open_channel",
    "prof",
    "publish_metric",
    "put_metric",
    "remove_exporter",
    "scalar",
    "set_strict",
    "shutdown",
    "telemetry",
]

__getattr__, __dir__ = lazy_names(globals(), EXTRA_EXPORTERS, stand_in_for_missing_extra=True)
