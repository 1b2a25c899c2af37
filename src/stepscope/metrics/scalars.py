"""The per-step scalar: values recorded in a step are reduced to one point per step and series.

``record()`` appends to the bounded ring (no lock, no clock read except at a series' first value
of a step); the export thread reduces each step's values with the scalar's reducer and closes a
step when the loop has moved on.
"""

from __future__ import annotations

from collections.abc import Callable

from stepscope.clock import now_ns, to_unix_ns
from stepscope.metrics.instruments import (
    _bad_value,
    _Base,
)
from stepscope.metrics.points import Family, Labels, ScalarPoint, SeriesPoint
from stepscope.metrics.ring import RECORDS, Ring
from stepscope.metrics.values import NUMBERS, as_number
from stepscope.steps import current_step

__all__ = ["REDUCERS", "Scalar", "ScalarSeries"]

REDUCERS = ("mean", "last", "sum", "min", "max")


class ScalarSeries:
    """One labelled series of a per-step scalar, reduced per step on the export thread."""

    __slots__ = (
        "_first_ns",
        "_last",
        "_last_point",
        "_open",
        "_reduce",
        "_ring",
        "_stamp",
        "_stamped",
        "labels",
        "name",
    )
    drop_key = RECORDS
    is_record = True

    def __init__(self, name: str, labels: Labels, ring: Ring, reduce: str) -> None:
        self.name = name
        self.labels = labels
        self._ring = ring
        self._reduce = reduce
        # export-thread state: step -> [count, sum, min, max, last]
        self._open: dict[int | None, list[float]] = {}
        self._last: float | None = None
        self._last_point: ScalarPoint | None = None
        # record time: the first value of each step queues (stamp, step, now_ns()) ahead of it;
        # _stamped is the step stamped last (caller side), reset by the export thread
        self._stamp = _StepStamp(self)
        self._stamped: object = _UNSTAMPED
        self._first_ns: dict[int | None, int] = {}

    def record(self, value: float, step: int | None = None) -> None:
        """Record ``value`` for ``step`` (default: the shared step counter)."""
        if step is None:
            step = current_step()
        elif step.__class__ is not int or step < 0:
            _bad_value(self.name, ValueError(f"step must be a non-negative int, got {step!r}"))
            return
        if value.__class__ not in NUMBERS:
            try:
                value = as_number(value)
            except TypeError as exc:
                _bad_value(self.name, exc)
                return
        ring = self._ring
        items = ring.items
        stamped = self._stamped
        if step is not stamped and step != stamped:  # identity first: the shared counter's int
            self._stamped = step
            if len(items) < ring.capacity:  # a full ring skips the stamp (export time is used)
                items.append((self._stamp, step, now_ns()))
        if len(items) < ring.high_water:
            items.append((self, step, value))
        else:
            ring.put(self, step, value)  # nearly full: wakes the export thread, or drops

    def drain(self, step: int | None, value: float) -> None:
        """Fold one queued value into its step (export thread)."""
        value = float(value)  # an int too large raises here, before it touches the step
        acc = self._open.get(step)
        if acc is None:
            self._open[step] = [1, value, value, value, value]
            return
        acc[0] += 1
        acc[1] += value
        if value < acc[2]:
            acc[2] = value
        if value > acc[3]:
            acc[3] = value
        acc[4] = value

    def close_steps(self, step_now: int | None, final: bool, now_unix_ns: int) -> list[ScalarPoint]:
        """Reduce and forget the steps that are over (all of them when ``final``)."""
        if not self._open:
            return []
        newest = max((s for s in self._open if s is not None), default=None)
        if step_now is not None and (newest is None or step_now > newest):
            newest = step_now
        points = []
        for step in sorted(self._open, key=lambda s: -1 if s is None else s):
            if final or step is None or (newest is not None and step < newest):
                count, total, low, high, last = self._open.pop(step)
                value = _reduce(self._reduce, count, total, low, high, last)
                first = self._first_ns.pop(step, None)
                when = now_unix_ns if first is None else to_unix_ns(first)
                point = ScalarPoint(
                    self.name, self.labels, step, value, int(count), self._reduce, when
                )
                self._last = value
                self._last_point = point
                points.append(point)
        if points:
            self._stamped = _UNSTAMPED  # a later value (same step, or the next interval) restamps
        if len(self._first_ns) > len(self._open):  # stamps whose value the full ring dropped
            self._first_ns = {s: t for s, t in self._first_ns.items() if s in self._open}
        return points

    def pending_count(self) -> int:
        """Samples folded into steps that are not closed yet."""
        return int(sum(acc[0] for acc in self._open.values()))

    def last_value(self) -> float | None:
        """The reduced value of the newest closed step."""
        return self._last

    def last_point(self) -> ScalarPoint | None:
        """The newest closed step's point (its step and record time)."""
        return self._last_point

    def _reset(self) -> None:
        self._open = {}
        self._last = None
        self._last_point = None
        self._first_ns = {}
        self._stamped = _UNSTAMPED


_UNSTAMPED = object()


class _StepStamp:
    """Ring target carrying when a scalar series got the first value of a step."""

    __slots__ = ("_series",)
    drop_key = "metrics_time"
    is_record = False

    def __init__(self, series: ScalarSeries) -> None:
        self._series = series

    def drain(self, step: int | None, mono_ns: int) -> None:
        """Keep when the step got its first value."""
        self._series._first_ns.setdefault(step, mono_ns)


def _reduce(how: str, count: float, total: float, low: float, high: float, last: float) -> float:
    if how == "mean":
        return total / count
    if how == "sum":
        return total
    if how == "min":
        return low
    if how == "max":
        return high
    return last


class Scalar(ScalarSeries, _Base[ScalarSeries]):
    """A per-step value (loss, throughput); ``reduce`` folds several values of one step."""

    kind = "scalar"

    def __init__(
        self, name: str, description: str, unit: str, limit: int, reduce: str, ring: Ring
    ) -> None:
        if reduce not in REDUCERS:
            raise ValueError(f"reduce must be one of {REDUCERS}, got {reduce!r}")
        self._init_base(
            name,
            description,
            unit,
            limit,
            (reduce,),
            lambda key: ScalarSeries(name, key, ring, reduce),
        )
        ScalarSeries.__init__(self, name, (), ring, reduce)
        self.reduce = reduce

    def family(self, pause: Callable[[], None]) -> Family:
        """The newest closed value of every series (a gauge for pull exporters)."""
        points = []
        for s in self.series():
            last = s.last_point()
            if last is not None:
                points.append(SeriesPoint(s.labels, last.value, last.step, last.time_unix_ns))
        return Family(self.name, "scalar", self.description, self.unit, tuple(points), "last")


# ----------------------------------------------------------------------------- registry
