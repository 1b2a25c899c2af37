"""The process pipeline: one per process, made on first use, and module-level shortcuts to it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.instruments import DEFAULT_LIMIT, Counter, Gauge, Histogram
from stepscope.metrics.pipeline import Pipeline
from stepscope.metrics.ring import Channel, RecordSink
from stepscope.metrics.scalars import Scalar
from stepscope.metrics.settings import PipelineOptions, PipelineSettings

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "add_exporter",
    "configure_pipeline",
    "counter",
    "flush",
    "gauge",
    "get_pipeline",
    "histogram",
    "open_channel",
    "remove_exporter",
    "scalar",
    "shutdown",
    "telemetry",
]

ExporterT = TypeVar("ExporterT", bound=Exporter)

_default: Pipeline | None = None
_default_lock = threading.Lock()


def get_pipeline() -> Pipeline:
    """The pipeline of this process (created on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Pipeline()
    return _default


def configure_pipeline(
    settings: PipelineSettings | None = None, **changes: Unpack[PipelineOptions]
) -> Pipeline:
    """Change the process pipeline's settings (see :meth:`Pipeline.configure`)."""
    pipeline = get_pipeline()
    pipeline.configure(settings, **changes)
    return pipeline


def counter(
    name: str, description: str = "", *, unit: str = "", limit: int = DEFAULT_LIMIT
) -> Counter:
    """The counter called ``name`` in the process pipeline."""
    return get_pipeline().counter(name, description, unit=unit, limit=limit)


def gauge(
    name: str,
    description: str = "",
    *,
    unit: str = "",
    limit: int = DEFAULT_LIMIT,
    merge: str = "last",
) -> Gauge:
    """The gauge called ``name`` in the process pipeline."""
    return get_pipeline().gauge(name, description, unit=unit, limit=limit, merge=merge)


def histogram(
    name: str,
    description: str = "",
    *,
    unit: str = "",
    buckets: Sequence[float] | None = None,
    exponential: bool = False,
    scale: int = 3,
    limit: int = DEFAULT_LIMIT,
) -> Histogram:
    """The histogram called ``name`` in the process pipeline."""
    return get_pipeline().histogram(
        name,
        description,
        unit=unit,
        buckets=buckets,
        exponential=exponential,
        scale=scale,
        limit=limit,
    )


def scalar(
    name: str,
    reduce: str = "mean",
    description: str = "",
    *,
    unit: str = "",
    limit: int = DEFAULT_LIMIT,
) -> Scalar:
    """The per-step scalar called ``name`` in the process pipeline."""
    return get_pipeline().scalar(name, reduce, description, unit=unit, limit=limit)


def add_exporter(exporter: ExporterT, name: str | None = None) -> ExporterT:
    """Start exporting the process pipeline to ``exporter``."""
    return get_pipeline().add_exporter(exporter, name)


def remove_exporter(exporter: Exporter) -> None:
    """Stop exporting the process pipeline to ``exporter``."""
    get_pipeline().remove_exporter(exporter)


def open_channel(name: str, sink: RecordSink) -> Channel:
    """A non-blocking lane through the process pipeline's ring to ``sink``."""
    return get_pipeline().open_channel(name, sink)


def flush(timeout_s: float | None = None) -> bool:
    """Export everything the process pipeline holds; True when done in time."""
    return get_pipeline().flush(timeout_s)


def shutdown(timeout_s: float | None = None) -> None:
    """Final export and stop of the process pipeline."""
    get_pipeline().shutdown(timeout_s)


def telemetry() -> dict[str, Any]:
    """Self-telemetry of the process pipeline."""
    return get_pipeline().telemetry()
