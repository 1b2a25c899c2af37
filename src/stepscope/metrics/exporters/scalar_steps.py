"""The step of each scalar's newest value, for exporters that keep one value per series.

Prometheus, the Pushgateway, StatsD and the OpenTelemetry exporters show a scalar as a gauge
holding its newest closed step's value; beside it they show the gauge ``<name>.step`` (same
labels) saying which step that value belongs to.  A ``step`` label is avoided on purpose: it
would start a new time series at every step.
"""

from __future__ import annotations

from collections.abc import Sequence

from stepscope.metrics.points import Family, SeriesPoint

__all__ = ["STEP_SUFFIX", "with_step_families"]

STEP_SUFFIX = ".step"


def with_step_families(families: Sequence[Family]) -> list[Family]:
    """``families`` plus, after each scalar family, its ``<name>.step`` gauge family."""
    out: list[Family] = []
    for family in families:
        out.append(family)
        if family.kind != "scalar":
            continue
        points = tuple(
            SeriesPoint(p.labels, float(p.step), p.step, p.time_unix_ns)
            for p in family.points
            if p.step is not None
        )
        if points:
            out.append(
                Family(
                    family.name + STEP_SUFFIX,
                    "gauge",
                    f"step of the newest {family.name} value",
                    "",
                    points,
                    family.merge,
                )
            )
    return out
