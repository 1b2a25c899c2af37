"""Instruments for new code: counter, gauge, histogram and per-step scalar.

Hot paths take no lock: counters and histograms write to a per-thread shard (a list only the
owning thread writes), gauges store one reference, scalars append to the bounded ring.  The
export thread sums the shards.  Label sets are bound once with ``.bind(**labels)``; each
instrument keeps at most ``limit`` series and folds the rest into one ``overflow="true"`` series.
"""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar, cast

from stepscope.metrics.cooperate import SNAPSHOT_CHUNK
from stepscope.metrics.failures import report_failure
from stepscope.metrics.points import (
    ExpHistogramValue,
    Family,
    HistogramValue,
    Kind,
    Labels,
    SeriesPoint,
)
from stepscope.metrics.ring import Ring
from stepscope.metrics.values import NUMBERS, as_number, is_tensor, resolve

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_LIMIT",
    "Counter",
    "CounterSeries",
    "ExpHistogramSeries",
    "Gauge",
    "GaugeSeries",
    "Histogram",
    "HistogramSeries",
]

DEFAULT_LIMIT = 2000
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
GAUGE_MERGES = ("last", "sum", "max", "min")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*\Z")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED_LABELS = frozenset(("le", "quantile", "overflow"))
OVERFLOW_LABELS: Labels = (("overflow", "true"),)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"metric name {name!r} is not valid: use letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or '_'"
        )
    return name


def _labels_key(labels: dict[str, object]) -> Labels:
    for key in labels:
        if not _LABEL.match(key) or key.startswith("__") or key in _RESERVED_LABELS:
            raise ValueError(
                f"label name {key!r} is not allowed: use letters, digits and '_' (not starting "
                "with '__'); 'le', 'quantile' and 'overflow' are reserved"
            )
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _bad_value(instrument: str, exc: Exception) -> None:
    report_failure("invalid_value", f"metric {instrument!r}", exc)


_INF = math.inf


def _fits(instrument: str, value: object) -> bool:
    """Whether a stored int converts to a float (else it is counted as a bad value)."""
    if value.__class__ is not int:
        return True
    try:
        float(value)  # type: ignore[arg-type]
    except OverflowError as exc:
        _bad_value(instrument, exc)
        return False
    return True


S = TypeVar("S")


class _Binder(Generic[S]):
    """The bound series of one instrument, capped at ``limit``."""

    __slots__ = ("lock", "make", "overflowed", "series")

    def __init__(self, make: Callable[[Labels], S]) -> None:
        self.series: dict[Labels, S] = {}
        self.make = make
        self.lock = threading.Lock()
        self.overflowed = 0

    def bind(self, root: S, limit: int, labels: dict[str, object]) -> S:
        if not labels:
            return root
        key = _labels_key(labels)
        found = self.series.get(key)
        if found is not None:
            return found
        with self.lock:
            found = self.series.get(key)
            if found is not None:
                return found
            if len(self.series) >= limit - 1:  # the overflow series counts toward the limit
                self.overflowed += 1
                key = OVERFLOW_LABELS
                found = self.series.get(key)
                if found is not None:
                    return found
            made = self.make(key)
            self.series[key] = made
            return made

    def all(self, root: S) -> list[S]:
        return [root, *self.series.values()]


class _Base(Generic[S]):
    """What every instrument has: name, description, unit, kind, options and a series cap."""

    kind = ""
    _binder: _Binder[S]

    def _init_base(
        self,
        name: str,
        description: str,
        unit: str,
        limit: int,
        options: tuple[Any, ...],
        make: Callable[[Labels], S],
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.name = _check_name(name)
        self.description = str(description)
        self.unit = str(unit)
        self.limit = limit
        self.options = options
        self._binder = _Binder(make)

    def _root(self) -> S:
        return cast(S, self)  # the instrument is its own unlabelled series

    def bind(self, **labels: object) -> S:
        """The series for ``labels`` (created once; call this outside the hot loop)."""
        return self._binder.bind(self._root(), self.limit, labels)

    def series(self) -> list[S]:
        """Every series including the unlabelled one."""
        return self._binder.all(self._root())

    def _touched(self, pause: Callable[[], None]) -> tuple[SeriesPoint, ...]:
        points = []
        for i, s in enumerate(self.series()):
            if i and i % SNAPSHOT_CHUNK == 0:
                pause()
            if cast(_Sharded, s).touched():
                points.append(SeriesPoint(cast(_Sharded, s).labels, cast(Any, s).value()))
        return tuple(points)


# ----------------------------------------------------------------------------- sharded series


class _Sharded:
    """A series kept as one cell per thread: only the owning thread writes its cell."""

    __slots__ = ("_cells", "_local", "_ring", "labels", "name")
    drop_key = "instrument"
    is_record = False

    def __init__(self, name: str, labels: Labels, ring: Ring) -> None:
        self.name = name
        self.labels = labels
        self._ring = ring
        self._local = threading.local()
        self._cells: list[list[Any]] = []

    def _empty_cell(self) -> list[Any]:
        raise NotImplementedError

    def _new_cell(self) -> list[Any]:
        cell = self._empty_cell()
        self._local.cell = cell
        self._cells.append(cell)
        return cell

    def touched(self) -> bool:
        """Whether anything was ever recorded."""
        return bool(self._cells)

    def drain(self, key: None, value: float) -> None:
        """Apply a value queued as a tensor, resolved on the export thread (no key is queued)."""
        self._apply(value)

    def _apply(self, value: float) -> None:
        raise NotImplementedError

    def _reset(self) -> None:
        self._local = threading.local()
        self._cells = []


# ----------------------------------------------------------------------------- counter


class CounterSeries(_Sharded):
    """One labelled series of a counter: a monotonically increasing total."""

    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (>= 0; a number or a one-element tensor)."""
        if amount.__class__ in NUMBERS and 0 <= amount < _INF:
            try:
                self._local.cell[0] += amount
            except AttributeError:
                self._add_new(amount)
            except OverflowError as exc:  # an int too large for a float
                _bad_value(self.name, exc)
        else:
            self._inc_other(amount)

    def _add_new(self, amount: float) -> None:
        try:
            self._new_cell()[0] += amount
        except OverflowError as exc:
            _bad_value(self.name, exc)

    def _empty_cell(self) -> list[Any]:
        return [0.0]

    def _inc_other(self, amount: object) -> None:
        try:
            number = as_number(amount)
        except TypeError as exc:
            _bad_value(self.name, exc)
            return
        if is_tensor(number):
            self._ring.put(self, None, number)
        else:
            self._apply(number)

    def _apply(self, number: float) -> None:
        if 0 <= number < _INF:
            self.inc(number)
        else:
            _bad_value(
                self.name, ValueError(f"a counter only goes up by finite steps; inc({number!r})")
            )

    def value(self) -> float:
        """The total so far (sum over threads)."""
        return float(sum(cell[0] for cell in list(self._cells)))


class Counter(CounterSeries, _Base[CounterSeries]):
    """A counter; ``inc()`` records on its unlabelled series, ``bind(**labels)`` gives others."""

    kind = "counter"

    def __init__(self, name: str, description: str, unit: str, limit: int, ring: Ring) -> None:
        self._init_base(
            name, description, unit, limit, (), lambda key: CounterSeries(name, key, ring)
        )
        CounterSeries.__init__(self, name, (), ring)

    def family(self, pause: Callable[[], None]) -> Family:
        """Current totals of all touched series."""
        return Family(self.name, "counter", self.description, self.unit, self._touched(pause))


# ----------------------------------------------------------------------------- gauge


class GaugeSeries:
    """One labelled series of a gauge: a value that is set (or moved up and down)."""

    __slots__ = ("_lock", "_ring", "_value", "labels", "name")

    def __init__(self, name: str, labels: Labels, ring: Ring) -> None:
        self.name = name
        self.labels = labels
        self._ring = ring
        self._value: Any = None
        self._lock = threading.Lock()

    def set(self, value: float) -> None:
        """Set the value (a number, or a one-element tensor read at export)."""
        if value.__class__ in NUMBERS:
            self._value = value
        else:
            try:
                self._value = as_number(value)
            except TypeError as exc:
                _bad_value(self.name, exc)

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (may be negative)."""
        if amount.__class__ not in NUMBERS:
            try:
                amount = as_number(amount)
            except TypeError as exc:
                _bad_value(self.name, exc)
                return
        with self._lock:
            try:
                value = amount if self._value is None else self._value + amount
                if value.__class__ is int:
                    float(value)  # OverflowError when too large for any exporter
                self._value = value
            except (OverflowError, TypeError) as exc:
                _bad_value(self.name, exc)

    def dec(self, amount: float = 1) -> None:
        """Subtract ``amount``."""
        self.inc(-amount)

    def raw(self) -> Any:
        """The stored value: None, a number or a tensor."""
        return self._value

    def _reset(self) -> None:
        self._value = None
        self._lock = threading.Lock()


class Gauge(GaugeSeries, _Base[GaugeSeries]):
    """A gauge; ``merge`` says how one endpoint combines the same series from several processes."""

    kind = "gauge"

    def __init__(
        self, name: str, description: str, unit: str, limit: int, merge: str, ring: Ring
    ) -> None:
        if merge not in GAUGE_MERGES:
            raise ValueError(f"merge must be one of {GAUGE_MERGES}, got {merge!r}")
        self._init_base(
            name, description, unit, limit, (merge,), lambda key: GaugeSeries(name, key, ring)
        )
        GaugeSeries.__init__(self, name, (), ring)
        self.merge = merge

    def family(self, pause: Callable[[], None]) -> Family:
        """Current values of all series that were set."""
        raws = [(s.labels, s.raw()) for s in self.series()]
        raws = [(labels, raw) for labels, raw in raws if raw is not None and _fits(self.name, raw)]
        values = resolve([raw for _, raw in raws])
        points = tuple(SeriesPoint(labels, v) for (labels, _), v in zip(raws, values, strict=True))
        return Family(self.name, "gauge", self.description, self.unit, points, self.merge)


# ----------------------------------------------------------------------------- histograms


class _HistogramBase(_Sharded):
    """What explicit and exponential histogram series share: the slow paths."""

    __slots__ = ()

    def observe(self, value: float) -> None:
        """Record one observation (a number or a one-element tensor)."""
        raise NotImplementedError

    def _observe_other(self, value: object) -> None:
        try:
            number = as_number(value)
        except TypeError as exc:
            _bad_value(self.name, exc)
            return
        if is_tensor(number):
            self._ring.put(self, None, number)
        else:
            self._apply(number)

    _finite_only = False
    """Whether ±inf is refused too (an exponential bucket index must be finite)."""

    def _apply(self, value: float) -> None:
        if value != value or (self._finite_only and not -_INF < value < _INF):
            _bad_value(self.name, ValueError(f"observation {value!r} ignored"))
        else:
            self.observe(value)

    def value(self) -> HistogramValue | ExpHistogramValue:
        """The merged state of all threads' cells."""
        raise NotImplementedError


class HistogramSeries(_HistogramBase):
    """One labelled series of an explicit-bucket histogram."""

    __slots__ = ("_bounds",)

    def __init__(self, name: str, labels: Labels, ring: Ring, bounds: tuple[float, ...]) -> None:
        super().__init__(name, labels, ring)
        self._bounds = bounds

    def observe(self, value: float) -> None:
        """Record one observation (a number or a one-element tensor)."""
        if value.__class__ in NUMBERS and value == value:
            try:
                cell = self._local.cell
            except AttributeError:
                cell = self._new_cell()
            try:
                cell[0] += value
            except OverflowError as exc:
                _bad_value(self.name, exc)
                return
            cell[3 + bisect_left(self._bounds, value)] += 1
            if value < cell[1]:
                cell[1] = value
            if value > cell[2]:
                cell[2] = value
        else:
            self._observe_other(value)

    def _empty_cell(self) -> list[Any]:
        # layout: sum, min, max, then one count per bucket (+Inf last)
        return [0.0, math.inf, -math.inf] + [0] * (len(self._bounds) + 1)

    def value(self) -> HistogramValue:
        """Bucket counts, sum, count, min and max over all threads."""
        width = len(self._bounds) + 1
        counts = [0] * width
        total = 0.0
        low = math.inf
        high = -math.inf
        for cell in list(self._cells):
            total += cell[0]
            low = min(low, cell[1])
            high = max(high, cell[2])
            for i in range(width):
                counts[i] += int(cell[3 + i])
        return HistogramValue(self._bounds, tuple(counts), total, sum(counts), low, high)


class ExpHistogramSeries(_HistogramBase):
    """One labelled series of a base-2 exponential histogram (sparse buckets, fixed scale)."""

    __slots__ = ("_factor", "scale")

    def __init__(self, name: str, labels: Labels, ring: Ring, scale: int) -> None:
        super().__init__(name, labels, ring)
        self.scale = scale
        self._factor = 2.0**scale

    def index(self, magnitude: float) -> int:
        """Bucket index of a positive ``magnitude``: ``base**i < magnitude <= base**(i+1)``."""
        mantissa, exponent = math.frexp(magnitude)
        if mantissa == 0.5:  # an exact power of two is the upper bound of its bucket
            power = exponent - 1
            if self.scale >= 0:
                return (power << self.scale) - 1
            shift = -self.scale
            return (power >> shift) - (1 if power % (1 << shift) == 0 else 0)
        if self.scale <= 0:
            return (exponent - 1) >> -self.scale
        return math.ceil(math.log2(magnitude) * self._factor) - 1

    _finite_only = True

    def observe(self, value: float) -> None:
        """Record one observation (a number or a one-element tensor)."""
        if value.__class__ in NUMBERS and -_INF < value < _INF:
            try:
                cell = self._local.cell
            except AttributeError:
                cell = self._new_cell()
            try:
                cell[0] += value
            except OverflowError as exc:
                _bad_value(self.name, exc)
                return
            if value < cell[1]:
                cell[1] = value
            if value > cell[2]:
                cell[2] = value
            if value > 0:
                buckets = cell[4]
                i = self.index(value)
            elif value < 0:
                buckets = cell[5]
                i = self.index(-value)
            else:
                cell[3] += 1
                return
            buckets[i] = buckets.get(i, 0) + 1
        else:
            self._observe_other(value)

    def _empty_cell(self) -> list[Any]:
        # layout: sum, min, max, zero count, positive {index: n}, negative {index: n}
        return [0.0, math.inf, -math.inf, 0, {}, {}]

    def value(self) -> ExpHistogramValue:
        """Sparse buckets, zero count, sum, count, min and max over all threads."""
        positive: dict[int, int] = {}
        negative: dict[int, int] = {}
        zero = 0
        total = 0.0
        low = math.inf
        high = -math.inf
        for cell in list(self._cells):
            total += cell[0]
            low = min(low, cell[1])
            high = max(high, cell[2])
            zero += cell[3]
            for target, source in ((positive, cell[4]), (negative, cell[5])):
                for index, n in list(source.items()):
                    target[index] = target.get(index, 0) + n
        count = zero + sum(positive.values()) + sum(negative.values())
        return ExpHistogramValue(
            self.scale,
            zero,
            tuple(sorted(positive.items())),
            tuple(sorted(negative.items())),
            total,
            count,
            low,
            high,
        )


class Histogram(_Base[_HistogramBase]):
    """A histogram: explicit ``buckets``, or base-2 exponential ones (``exponential=True``)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        description: str,
        unit: str,
        limit: int,
        ring: Ring,
        buckets: Sequence[float] | None,
        exponential: bool,
        scale: int,
    ) -> None:
        make: Callable[[Labels], _HistogramBase]
        if exponential:
            if buckets is not None:
                raise ValueError("pass either buckets=... or exponential=True, not both")
            if isinstance(scale, bool) or not isinstance(scale, int) or not -10 <= scale <= 20:
                raise ValueError(f"scale must be an int in [-10, 20], got {scale!r}")
            options: tuple[Any, ...] = ("exponential", scale)

            def make(key: Labels) -> _HistogramBase:
                return ExpHistogramSeries(name, key, ring, scale)
        else:
            bounds = _check_buckets(DEFAULT_BUCKETS if buckets is None else buckets)
            options = ("explicit", bounds)

            def make(key: Labels) -> _HistogramBase:
                return HistogramSeries(name, key, ring, bounds)

        self._init_base(name, description, unit, limit, options, make)
        self.exponential = exponential
        self._unlabelled = make(())
        self.observe: Callable[[float], None] = self._unlabelled.observe

    def _root(self) -> _HistogramBase:
        return self._unlabelled

    def family(self, pause: Callable[[], None]) -> Family:
        """Current buckets of all touched series."""
        kind: Kind = "exponential_histogram" if self.exponential else "histogram"
        return Family(self.name, kind, self.description, self.unit, self._touched(pause))


def _check_buckets(buckets: Iterable[float]) -> tuple[float, ...]:
    try:
        bounds = tuple(float(b) for b in buckets)
    except (TypeError, ValueError):
        raise TypeError(f"buckets must be a sequence of numbers, got {buckets!r}") from None
    bounds = tuple(b for b in bounds if b != math.inf)
    if not bounds or any(b != b for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise ValueError(
            f"buckets must be distinct, increasing, non-NaN upper bounds, got {buckets!r}"
        )
    return bounds


# ----------------------------------------------------------------------------- scalar
