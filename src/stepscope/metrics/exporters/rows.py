"""Flat rows of a batch for line-oriented exporters (JSONL, CSV, console, logging, handlers).

Scalar points and seed-API records appear once each, with their step and record time;
instrument series appear when their value changed since the previous batch, with the snapshot's
time and step (the pipeline's own telemetry only in the final batch; the step gauge always).
"""

from __future__ import annotations

from typing import Any

from stepscope.metrics.points import (
    ExpHistogramValue,
    ExportBatch,
    Family,
    HistogramValue,
    Labels,
    SummaryValue,
)

__all__ = ["STEP_GAUGE", "ChangeFilter", "format_labels", "is_telemetry", "rows"]

_TELEMETRY_PREFIX = "stepscope."
STEP_GAUGE = "stepscope.step"
"""The shared step counter's gauge: not self-telemetry, so exported like any series."""


def is_telemetry(name: str) -> bool:
    """Whether ``name`` is the pipeline's own telemetry (the step gauge is not)."""
    return name.startswith(_TELEMETRY_PREFIX) and name != STEP_GAUGE


def format_labels(labels: Labels) -> str:
    """``{k="v",...}`` or an empty string."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


class ChangeFilter:
    """Remembers the last value written per series so unchanged series are skipped."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, Labels], object] = {}

    def changed(self, family: Family, labels: Labels, value: object) -> bool:
        """Whether ``value`` differs from what was last written for this series."""
        key = (family.name, labels)
        if self._seen.get(key) == value:
            return False
        self._seen[key] = value
        return True

    def reset(self) -> None:
        """Forget everything (a forked child starts a new file)."""
        self._seen.clear()


def _series_row(family: Family, labels: Labels, value: object) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": family.kind, "name": family.name, "labels": dict(labels)}
    if isinstance(value, (HistogramValue, ExpHistogramValue)):
        row.update(count=value.count, sum=value.sum, min=value.min, max=value.max)
    if isinstance(value, HistogramValue):
        row.update(bounds=list(value.bounds), counts=list(value.counts))
    elif isinstance(value, ExpHistogramValue):
        row.update(
            scale=value.scale,
            zero_count=value.zero_count,
            positive={str(i): n for i, n in value.positive},
            negative={str(i): n for i, n in value.negative},
        )
    elif isinstance(value, SummaryValue):
        row.update(count=value.count, sum=value.sum)
    else:
        row["value"] = value
    return row


def rows(batch: ExportBatch, changes: ChangeFilter | None) -> list[dict[str, Any]]:
    """The batch as dict rows, oldest records first; each carries ``time_unix_ns``."""
    out: list[dict[str, Any]] = []
    for record in batch.records:
        out.append(
            {
                "time_unix_ns": record.time_unix_ns,
                "kind": "record",
                "group": record.group,
                "name": record.name,
                "step": record.step,
                "value": record.value,
            }
        )
    for point in batch.scalars:
        out.append(
            {
                "time_unix_ns": point.time_unix_ns,
                "kind": "scalar",
                "name": point.name,
                "labels": dict(point.labels),
                "step": point.step,
                "value": point.value,
                "count": point.count,
                "reduce": point.reduce,
            }
        )
    for family in batch.families:
        if family.kind == "scalar":
            continue  # already written as per-step points
        if is_telemetry(family.name) and not batch.final:
            continue
        for series in family.points:
            if changes is not None and not changes.changed(family, series.labels, series.value):
                continue
            row = _series_row(family, series.labels, series.value)
            row["time_unix_ns"] = batch.time_unix_ns
            row["step"] = batch.step
            out.append(row)
    return out
