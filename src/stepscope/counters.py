"""Named sets of numeric counters: cheap thread-safe increments, snapshots, resets and deltas.

A ``CounterSet`` holds counters by name.  ``inc`` touches only a dict private to the calling
thread (no lock); readers sum the per-thread dicts under the set's lock.  ``reset()`` zeroes every
counter the set has seen by moving a baseline, so increments racing with it are never lost.

Deltas re-create the "cached metrics" pattern: take ``snapshot()`` before some work, store
``delta(since)`` next to its cached result, and ``apply(delta)`` on a cache hit so the counters read
as if the work had run again.  Deltas are plain ``{name: number}`` dicts (JSON- and pickle-safe).

Counters reach traces through ``stepscope.collectors.counters.CounterCollector`` and the metrics
pipeline through ``emit_counters(emit)``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping

from stepscope import forks

__all__ = [
    "CounterSet",
    "Number",
    "apply",
    "counter_pairs",
    "counter_set",
    "counter_sets",
    "default",
    "delta",
    "emit_counters",
    "get",
    "inc",
    "reset",
    "snapshot",
]

Number = int | float


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"counter names must be non-empty str, got {type(name).__name__}: {name!r}")
    return name


def _check_amount(name: str, n: object) -> Number:
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        raise TypeError(
            f"counter {name!r}: the amount must be an int or float, got {type(n).__name__}: {n!r}"
        )
    return n


class CounterSet:
    """A named group of counters; every method is safe to call from any thread."""

    def __init__(self, name: str, counters: Iterable[str] = ()) -> None:
        self.name = _check_name(name)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._shards: list[tuple[threading.Thread, dict[str, Number]]] = []
        self._retired: dict[str, Number] = {}  # folded shards of threads that have exited
        self._baseline: dict[str, Number] = {}  # totals at the last reset
        self._declared: dict[str, None] = {}
        self.declare(*counters)
        _ALL_SETS.add(self)

    def __repr__(self) -> str:
        return f"CounterSet({self.name!r}, {self.snapshot()!r})"

    # -- hot path ----------------------------------------------------------------------------
    def inc(self, name: str, n: Number = 1) -> None:
        """Add ``n`` (default 1) to counter ``name``, creating it at 0 if new."""
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        value = shard.get(name)
        if value is None:
            shard[_check_name(name)] = _check_amount(name, n)
            return
        try:
            shard[name] = value + n
        except TypeError:
            _check_amount(name, n)
            raise

    def _new_shard(self) -> dict[str, Number]:
        shard: dict[str, Number] = {}
        with self._lock:
            self._shards.append((threading.current_thread(), shard))
        self._local.shard = shard
        return shard

    # -- reading -----------------------------------------------------------------------------
    def _totals_locked(self) -> dict[str, Number]:
        totals: dict[str, Number] = dict.fromkeys(self._declared, 0)
        live: list[tuple[threading.Thread, dict[str, Number]]] = []
        for thread, shard in self._shards:
            if thread.is_alive():
                live.append((thread, shard))
                self._totals_add(totals, shard.copy())
            else:  # the owner is gone, so nothing writes this shard any more
                self._totals_add(self._retired, shard)
        if len(live) != len(self._shards):
            self._shards = live
        self._totals_add(totals, self._retired)
        return totals

    @staticmethod
    def _totals_add(into: dict[str, Number], values: Mapping[str, Number]) -> None:
        for key, value in values.items():
            into[key] = into.get(key, 0) + value

    def snapshot(self) -> dict[str, Number]:
        """Every counter's current value (declared and used ones, zeros included)."""
        with self._lock:
            totals = self._totals_locked()
            base = self._baseline
            return {key: value - base.get(key, 0) for key, value in totals.items()}

    def get(self, name: str) -> Number:
        """The current value of one counter (0 if it was never incremented)."""
        with self._lock:
            total: Number = 0
            for _, shard in self._shards:
                total += shard.get(name, 0)
            return total + self._retired.get(name, 0) - self._baseline.get(name, 0)

    def names(self) -> list[str]:
        """Names of the counters in this set, declared first, then in order of first use."""
        return list(self.snapshot())

    # -- changing ----------------------------------------------------------------------------
    def declare(self, *names: str) -> None:
        """Make counters known (they read 0 and appear in snapshots before any ``inc``)."""
        for name in names:
            self._declared[_check_name(name)] = None

    def reset(self) -> dict[str, Number]:
        """Set every counter of the set back to 0; returns the values they had (read-and-clear)."""
        with self._lock:
            totals = self._totals_locked()
            base = self._baseline
            self._baseline = totals
            return {key: value - base.get(key, 0) for key, value in totals.items()}

    def delta(
        self, since: Mapping[str, Number], names: Iterable[str] | None = None
    ) -> dict[str, Number]:
        """What the counters gained since the ``snapshot()`` ``since`` (non-zero changes only).

        ``names`` limits the result to those counters (the ones worth replaying on a cache hit).
        """
        if not isinstance(since, Mapping):
            raise TypeError(
                f"delta(since=...) takes a snapshot() mapping, got {type(since).__name__}"
            )
        now = self.snapshot()
        keys = list(now) + [k for k in since if k not in now]
        if names is not None:
            wanted = set(names)
            keys = [k for k in keys if k in wanted]
        out: dict[str, Number] = {}
        for key in keys:
            change = now.get(key, 0) - since.get(key, 0)
            if change:
                out[key] = change
        return out

    def apply(self, delta: Mapping[str, Number]) -> None:
        """Add a ``delta(...)`` result to the counters (replay recorded work on a cache hit)."""
        if not isinstance(delta, Mapping):
            raise TypeError(f"apply() takes a delta mapping, got {type(delta).__name__}")
        checked = [(_check_name(k), _check_amount(k, v)) for k, v in delta.items()]
        for name, amount in checked:
            self.inc(name, amount)

    def pairs(self, prefix: str | None = None) -> list[tuple[str, Number]]:
        """``(name, value)`` pairs of a snapshot; names become ``prefix.name`` when given."""
        values = self.snapshot()
        if prefix:
            return [(f"{prefix}.{key}", value) for key, value in values.items()]
        return list(values.items())

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


_ALL_SETS: weakref.WeakSet[CounterSet] = weakref.WeakSet()
_NAMED: dict[str, CounterSet] = {}
_NAMED_LOCK = threading.Lock()


def _reinit_after_fork() -> None:
    global _NAMED_LOCK
    _NAMED_LOCK = threading.Lock()
    for counter_set_ in list(_ALL_SETS):
        counter_set_._after_fork()


forks.after_fork_in_child(_reinit_after_fork)


def counter_set(name: str, counters: Iterable[str] = ()) -> CounterSet:
    """The shared set called ``name`` (created on first use); ``counters`` are declared in it."""
    with _NAMED_LOCK:
        found = _NAMED.get(name)
        if found is None:
            found = _NAMED[name] = CounterSet(name)
    found.declare(*counters)
    return found


def counter_sets() -> list[CounterSet]:
    """Every shared set made with ``counter_set`` (the default one included)."""
    with _NAMED_LOCK:
        return list(_NAMED.values())


default = counter_set("default")
"""The default set, used by the module-level functions."""

inc = default.inc
get = default.get
snapshot = default.snapshot
reset = default.reset
delta = default.delta
apply = default.apply


def counter_pairs(sets: Iterable[CounterSet] | None = None) -> list[tuple[str, Number]]:
    """``("<set>.<counter>", value)`` pairs of the given sets (all shared sets by default)."""
    chosen = counter_sets() if sets is None else list(sets)
    out: list[tuple[str, Number]] = []
    for counter_set_ in chosen:
        out.extend(counter_set_.pairs(prefix=counter_set_.name))
    return out


def emit_counters(
    emit: Callable[[str, Number], object], sets: Iterable[CounterSet] | None = None
) -> int:
    """Call ``emit(name, value)`` for every counter (e.g. a metrics gauge); returns how many."""
    pairs = counter_pairs(sets)
    for name, value in pairs:
        emit(name, value)
    return len(pairs)
