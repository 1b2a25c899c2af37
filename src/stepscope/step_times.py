"""Every step's start and end, recorded or not, in a small bounded ring (two stamps a step).

The profile stamps a step's start when ``step()`` returns and its end when the next ``step()``
(or ``stop()``) is entered, so a step's time is the program's own loop body: the profiler's
work at the step edge (window starts, stops, trace writing) falls between steps and is kept
apart.  Each step carries the schedule's action it ran under, so a report can compare the
steps recorded with the steps not recorded of the same run (``summary``).  The ring keeps the
last ``capacity`` steps; older ones are dropped and counted.  ``begin`` and ``end`` only store
a clock reading each: everything else is worked out when a summary is asked for.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable
from typing import Any

from stepscope.clock import now_ns

__all__ = ["KINDS", "StepTimes"]

KINDS = ("unrecorded", "warmup", "recorded")
"""What a step ran under: no profiling, the schedule's warmup, a recording window."""


class StepTimes:
    """A bounded ring of (start, end, kind) per step; ``begin``/``end`` are the step hook."""

    __slots__ = (
        "_count",
        "_ends",
        "_kinds",
        "_open",
        "_slot",
        "_starts",
        "capacity",
        "collector_ns",
    )

    def __init__(self, capacity: int = 8192) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, got {capacity}")
        self.capacity = capacity
        self._starts = array("q", bytes(8 * capacity))
        self._ends = array("q", bytes(8 * capacity))
        self._kinds = bytearray(capacity)
        self._count = 0
        self._slot = 0
        self._open = False
        self.collector_ns: dict[str, int] = {}  # each collector's time in its hooks

    @property
    def dropped(self) -> int:
        """Steps no longer kept (the ring holds the last ``capacity``)."""
        return max(0, self._count - self.capacity)

    def __len__(self) -> int:
        return min(self._count, self.capacity)

    def begin(self, kind: int) -> None:
        """A step starts now; ``kind`` is the schedule action's value (0 none, 1 warmup, 2 and 3
        recording)."""
        slot = self._slot
        self._kinds[slot] = kind if kind < 2 else 2
        self._open = True
        self._starts[slot] = now_ns()

    def end(self) -> None:
        """The open step ends now (nothing happens when none is open)."""
        if self._open:
            self._ends[self._slot] = now_ns()
            self._open = False
            self._count += 1
            self._slot = self._count % self.capacity

    def timed(self, collector: str, hook: Callable[[], Any]) -> None:
        """Run one collector hook, adding its time to ``collector_ns``."""
        began = now_ns()
        try:
            hook()
        finally:
            spent = now_ns() - began
            self.collector_ns[collector] = self.collector_ns.get(collector, 0) + spent

    def _kept(self) -> range:
        return range(self._count - len(self), self._count)

    def durations(self) -> dict[str, list[int]]:
        """The kept steps' durations (ns) by kind, oldest first."""
        found: dict[str, list[int]] = {kind: [] for kind in KINDS}
        for n in self._kept():
            slot = n % self.capacity
            found[KINDS[self._kinds[slot]]].append(self._ends[slot] - self._starts[slot])
        return found

    def edges(self) -> dict[str, int]:
        """Time between a kept step's end and the next one's start, by the ended step's kind."""
        found = dict.fromkeys(KINDS, 0)
        kept = self._kept()
        for n in kept[:-1]:
            slot, following = n % self.capacity, (n + 1) % self.capacity
            found[KINDS[self._kinds[slot]]] += self._starts[following] - self._ends[slot]
        return found

    def summary(self) -> dict[str, Any]:
        """Per kind: count, median and mean ns; the recorded steps' slowdown over unrecorded
        ones (``slowdown_pct``, None without both); edge time; drops.  Plain JSON values."""
        durations = self.durations()
        kinds: dict[str, dict[str, Any]] = {}
        for kind, values in durations.items():
            kinds[kind] = {
                "count": len(values),
                "median_ns": int(statistics.median(values)) if values else None,
                "mean_ns": int(statistics.fmean(values)) if values else None,
            }
        recorded = kinds["recorded"]["median_ns"]
        unrecorded = kinds["unrecorded"]["median_ns"]
        slowdown = (
            100.0 * (recorded - unrecorded) / unrecorded
            if recorded is not None and unrecorded
            else None
        )
        return {
            "steps": kinds,
            "slowdown_pct": slowdown,
            "edge_ns": self.edges(),
            "collector_ns": dict(self.collector_ns),
            "dropped": self.dropped,
        }
