"""Line exporters: console, logging, and any seed-API MetricHandler used as an exporter.

All of them run on the export thread, so a slow terminal or handler never delays the loop.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

from stepscope.metrics.api import MetricData, MetricHandler
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.exporters.rows import ChangeFilter, rows
from stepscope.metrics.points import ExportBatch
from stepscope.text import clean_text

__all__ = ["ConsoleExporter", "HandlerExporter", "LoggingExporter", "format_row"]


def _series_name(row: dict[str, Any]) -> str:
    labels = row.get("labels") or {}
    if not labels:
        return str(row["name"])
    inner = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"{row['name']}{{{inner}}}"


def _row_value(row: dict[str, Any]) -> Any:
    if "value" in row:
        return row["value"]
    return f"count={row['count']} sum={row['sum']}"


def format_row(row: dict[str, Any]) -> str:
    """One human-readable line; seed-API records keep the torchelastic console format."""
    seconds = row["time_unix_ns"] / 1e9
    if row["kind"] == "record":
        return f"[{seconds}][{row['group']}]: {row['name']}={row['value']}"
    if row["kind"] == "scalar":
        return f"[{seconds}][step {row['step']}]: {_series_name(row)}={row['value']}"
    step = "" if row.get("step") is None else f"[step {row['step']}]"
    return f"[{seconds}][{row['kind']}]{step}: {_series_name(row)}={_row_value(row)}"


class ConsoleExporter(Exporter):
    """Prints every row to ``stream`` (default: standard output at export time)."""

    name = "console"

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream
        self._changes = ChangeFilter()

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Print the batch's rows."""
        lines = [format_row(r) for r in rows(batch, self._changes)]
        if lines:
            stream = self.stream if self.stream is not None else sys.stdout
            stream.write(clean_text("\n".join(lines) + "\n"))  # a UTF-8 stdout takes it
            stream.flush()

    def after_fork_in_child(self) -> None:
        """A child prints its own changes."""
        self._changes.reset()


class LoggingExporter(Exporter):
    """Logs every row through ``logger`` at ``level``."""

    name = "logging"

    def __init__(
        self, logger: logging.Logger | str = "stepscope.metrics.export", level: int = logging.INFO
    ) -> None:
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.level = level
        self._changes = ChangeFilter()

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Log the batch's rows."""
        for row in rows(batch, self._changes):
            self.logger.log(self.level, "%s", clean_text(format_row(row)))

    def after_fork_in_child(self) -> None:
        """A child logs its own changes."""
        self._changes.reset()


class HandlerExporter(Exporter):
    """Feeds a seed-API :class:`MetricHandler` from the export thread.

    Records keep their group; scalar points and instrument series use ``group`` and a name
    with labels (``loss{rank=0}``).  Histogram series report their count.
    """

    name = "handler"

    def __init__(self, handler: MetricHandler, group: str = "stepscope") -> None:
        if not callable(getattr(handler, "emit", None)):
            raise TypeError(f"handler must be a MetricHandler, got {type(handler).__name__}")
        self.handler = handler
        self.group = group
        self._changes = ChangeFilter()

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Emit one MetricData per row."""
        for row in rows(batch, self._changes):
            seconds = row["time_unix_ns"] / 1e9
            if row["kind"] == "record":
                data = MetricData(seconds, row["group"], row["name"], row["value"])
            else:
                value = row["value"] if "value" in row else row["count"]
                data = MetricData(seconds, self.group, _series_name(row), value)
            self.handler.emit(data)

    def after_fork_in_child(self) -> None:
        """A child emits its own changes."""
        self._changes.reset()
