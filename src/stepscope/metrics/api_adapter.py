"""The torchelastic API on the pipeline: ``put_metric`` / ``@prof`` values queued, never written.

:class:`PipelineMetricHandler` is a torchelastic ``MetricHandler`` that puts each value on the
pipeline's ring (no I/O on the caller); on the export thread :class:`ApiRecords` turns them into
per-value records (files get every value) and per-name summaries (sum and count, label
``group``) for exporters that keep time series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.clock import now_ns, to_unix_ns
from stepscope.metrics.api import MetricData, MetricHandler
from stepscope.metrics.points import Family, Labels, Record, SeriesPoint, SummaryValue
from stepscope.metrics.ring import RECORDS
from stepscope.steps import current_step

if TYPE_CHECKING:
    from stepscope.metrics.pipeline import Pipeline

__all__ = ["ApiRecords", "PipelineMetricHandler"]

_NS = 1_000_000_000


class ApiRecords:
    """Ring target for the values sent through the torchelastic API."""

    drop_key = RECORDS
    is_record = True

    def __init__(self) -> None:
        self.pending: list[Record] = []
        self.totals: dict[tuple[str | None, str], list[float]] = {}

    def drain(self, data: MetricData, step: int | None) -> None:
        """Keep one value as a record and add it to its name's summary (export thread)."""
        value = float(data.value)
        self.pending.append(
            Record(int(data.timestamp * _NS), data.group_name, str(data.name), value, step)
        )
        key = (data.group_name, str(data.name))
        acc = self.totals.get(key)
        if acc is None:
            self.totals[key] = [1, value]
        else:
            acc[0] += 1
            acc[1] += value

    def take(self) -> list[Record]:
        """The records drained since the last call."""
        pending, self.pending = self.pending, []
        return pending

    def families(self) -> list[Family]:
        """One summary family per metric name (label ``group``)."""
        by_name: dict[str, list[SeriesPoint]] = {}
        for (group, name), (count, total) in self.totals.items():
            labels: Labels = (("group", group or ""),)
            by_name.setdefault(name, []).append(
                SeriesPoint(labels, SummaryValue(total, int(count)))
            )
        return [
            Family(name, "summary", "values reported with put_metric / @prof", "", tuple(points))
            for name, points in by_name.items()
        ]

    def reset(self) -> None:
        """Forget everything (a forked child)."""
        self.pending = []
        self.totals = {}


class PipelineMetricHandler(MetricHandler):
    """Sends torchelastic API values (``put_metric``, ``@prof``) into a pipeline: no caller I/O."""

    def __init__(self, pipeline: Pipeline | None = None) -> None:
        if pipeline is None:
            from stepscope.metrics.default import get_pipeline

            pipeline = get_pipeline()
        self._ring = pipeline.ring
        self._records = pipeline.api_records

    def emit(self, metric_data: MetricData) -> None:
        """Queue one value (with the current step)."""
        self._ring.put(self._records, metric_data, current_step())

    def emit_elapsed(self, group_name: str | None, metric_name: str, elapsed_ns: int) -> None:
        """Queue a duration in milliseconds with nanosecond resolution."""
        wall = to_unix_ns(now_ns()) / _NS
        data = MetricData(wall, group_name, metric_name, elapsed_ns / 1e6)
        self._ring.put(self._records, data, current_step())
