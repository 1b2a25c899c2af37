"""What the export thread hands to exporters: immutable families of series, step scalars, records.

Instruments are cumulative (a counter's value is its total since the process started); scalars
and records are deltas (each appears in exactly one batch).  Everything here is plain data, so
an exporter never touches the live instruments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ExpHistogramValue",
    "ExportBatch",
    "Family",
    "HistogramValue",
    "Kind",
    "Labels",
    "Record",
    "ScalarPoint",
    "SeriesPoint",
    "SummaryValue",
    "family_from_json",
    "family_to_json",
    "labels_dict",
]

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name."""

Kind = Literal["counter", "gauge", "histogram", "exponential_histogram", "summary", "scalar"]


def labels_dict(labels: Labels) -> dict[str, str]:
    """Labels as a dict."""
    return dict(labels)


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """An explicit-bucket histogram: ``counts[i]`` observations ``<= bounds[i]`` (last: +Inf)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int
    min: float
    max: float

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs ending with +Inf."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class ExpHistogramValue:
    """A base-2 exponential histogram (OpenTelemetry layout): bucket ``i`` is ``(b**i, b**(i+1)]``.

    ``b = 2 ** (2 ** -scale)``; ``positive``/``negative`` map bucket index to count.
    """

    scale: int
    zero_count: int
    positive: tuple[tuple[int, int], ...]
    negative: tuple[tuple[int, int], ...]
    sum: float
    count: int
    min: float
    max: float

    def upper_bound(self, index: int) -> float:
        """Upper boundary of positive bucket ``index``."""
        return float(2.0 ** ((index + 1) * 2.0**-self.scale))

    def cumulative(self) -> list[tuple[float, int]]:
        """Classic (upper bound, cumulative count) pairs: negatives and zero first, then +Inf."""
        out: list[tuple[float, int]] = []
        total = 0
        for index, n in sorted(self.negative, reverse=True):
            total += n
            out.append((-float(2.0 ** (index * 2.0**-self.scale)), total))
        total += self.zero_count
        if self.zero_count or self.negative:
            out.append((0.0, total))
        for index, n in sorted(self.positive):
            total += n
            out.append((self.upper_bound(index), total))
        out.append((float("inf"), self.count))
        return out


@dataclass(frozen=True, slots=True)
class SummaryValue:
    """Sum and count of values reported through the seed API (``put_metric``)."""

    sum: float
    count: int


Value = float | HistogramValue | ExpHistogramValue | SummaryValue


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One series of a family: its labels and current value.

    A scalar's series also carry the step of that value and when it was recorded (Unix ns).
    """

    labels: Labels
    value: Value
    step: int | None = None
    time_unix_ns: int = 0


@dataclass(frozen=True, slots=True)
class Family:
    """All series of one instrument at one export."""

    name: str
    kind: Kind
    description: str
    unit: str
    points: tuple[SeriesPoint, ...]
    merge: str = "sum"


@dataclass(frozen=True, slots=True)
class ScalarPoint:
    """The reduced value of one scalar series over one step (``step`` None: over one interval)."""

    name: str
    labels: Labels
    step: int | None
    value: float
    count: int
    reduce: str
    time_unix_ns: int


@dataclass(frozen=True, slots=True)
class Record:
    """One value reported through the seed API and routed to the pipeline."""

    time_unix_ns: int
    group: str | None
    name: str
    value: float
    step: int | None = None


@dataclass(frozen=True, slots=True)
class ExportBatch:
    """What one export cycle hands to every exporter."""

    time_unix_ns: int
    start_unix_ns: int
    families: tuple[Family, ...]
    scalars: tuple[ScalarPoint, ...] = ()
    records: tuple[Record, ...] = ()
    final: bool = False
    pid: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    step: int | None = None
    """The shared step counter when the snapshot was taken (the last one declared)."""

    @property
    def record_count(self) -> int:
        """Raw records this batch accounts for (scalar samples and seed-API records)."""
        return sum(s.count for s in self.scalars) + len(self.records)


def _value_to_json(kind: str, value: Value) -> Any:
    if isinstance(value, HistogramValue):
        return {
            "bounds": list(value.bounds),
            "counts": list(value.counts),
            "sum": value.sum,
            "count": value.count,
            "min": value.min,
            "max": value.max,
        }
    if isinstance(value, ExpHistogramValue):
        return {
            "scale": value.scale,
            "zero_count": value.zero_count,
            "positive": [list(p) for p in value.positive],
            "negative": [list(p) for p in value.negative],
            "sum": value.sum,
            "count": value.count,
            "min": value.min,
            "max": value.max,
        }
    if isinstance(value, SummaryValue):
        return {"sum": value.sum, "count": value.count}
    return value


def _value_from_json(kind: str, data: Any) -> Value:
    if kind == "histogram":
        return HistogramValue(
            tuple(float(b) for b in data["bounds"]),
            tuple(int(c) for c in data["counts"]),
            float(data["sum"]),
            int(data["count"]),
            float(data["min"]),
            float(data["max"]),
        )
    if kind == "exponential_histogram":
        return ExpHistogramValue(
            int(data["scale"]),
            int(data["zero_count"]),
            tuple((int(i), int(n)) for i, n in data["positive"]),
            tuple((int(i), int(n)) for i, n in data["negative"]),
            float(data["sum"]),
            int(data["count"]),
            float(data["min"]),
            float(data["max"]),
        )
    if kind == "summary":
        return SummaryValue(float(data["sum"]), int(data["count"]))
    return float(data)


def family_to_json(family: Family) -> dict[str, Any]:
    """A JSON-ready dict for ``family`` (see :func:`family_from_json`)."""
    return {
        "name": family.name,
        "kind": family.kind,
        "description": family.description,
        "unit": family.unit,
        "merge": family.merge,
        "points": [
            [[list(pair) for pair in p.labels], _value_to_json(family.kind, p.value)]
            for p in family.points
        ],
    }


_KINDS = ("counter", "gauge", "histogram", "exponential_histogram", "summary", "scalar")


def family_from_json(data: Mapping[str, Any]) -> Family:
    """Rebuild a family written by :func:`family_to_json`; ValueError on malformed input."""
    try:
        kind = data["kind"]
        if kind not in _KINDS:
            raise ValueError(f"unknown family kind {kind!r}")
        points = tuple(
            SeriesPoint(
                tuple((str(k), str(v)) for k, v in labels),
                _value_from_json(kind, value),
            )
            for labels, value in data["points"]
        )
        return Family(
            str(data["name"]),
            kind,
            str(data.get("description", "")),
            str(data.get("unit", "")),
            points,
            str(data.get("merge", "sum")),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed metric family: {exc!r}") from exc
