"""Every step's start and end, recorded or not, in a small bounded ring (two stamps a step).

The profile stamps a step's start when ``step()`` returns and its end when the next ``step()``
(or ``stop()``) is entered, so a step's time is the program's own loop body: the profiler's
work at the step edge (window starts, stops, trace writing) falls between steps and is kept
apart.  Each step carries the schedule's action it ran under, so a report can compare the
steps recorded with the steps not recorded of the same run (``summary``).  The ring keeps the
last ``capacity`` steps; older ones are dropped and counted.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable
from typing import Any

from stepscope import clock

__all__ = ["KINDS", "StepTimes"]

KINDS = ("unrecorded", "warmup", "recorded")
"""What a step ran under: no profiling, the schedule's warmup, a recording window."""


class StepTimes:
    """A bounded ring of (start, end, kind) per step; ``begin``/``end`` are the step hook."""

    def __init__(self, capacity: int = 8192) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, got {capacity}")
        self.capacity = capacity
        self._starts = array("q", bytes(8 * capacity))
        self._ends = array("q", bytes(8 * capacity))
        self._kinds = bytearray(capacity)
        self._count = 0
        self._open_start = -1
        self._open_kind = 0
        self.edge_ns = [0, 0, 0]
        """Time spent at step edges (inside ``step()``), by the kind of step that ended."""
        self._edge_from = -1
        self.collector_ns: dict[str, int] = {}
        """Time each collector spent in its hooks (prepare, start, on_step, stop, collect...)."""

    @property
    def dropped(self) -> int:
        """Steps no longer kept (the ring holds the last ``capacity``)."""
        return max(0, self._count - self.capacity)

    def __len__(self) -> int:
        return min(self._count, self.capacity)

    def begin(self, kind: int) -> None:
        """A step starts now; ``kind`` is the schedule action's value (0 none, 1 warmup, 2 and 3
        recording)."""
        now = clock.now_ns()
        if self._edge_from >= 0:
            self.edge_ns[self._open_kind] += now - self._edge_from
            self._edge_from = -1
        self._open_start = now
        self._open_kind = kind if kind < 2 else 2

    def end(self) -> None:
        """The open step ends now (nothing happens when none is open)."""
        now = clock.now_ns()
        start = self._open_start
        if start < 0:
            return
        slot = self._count % self.capacity
        self._starts[slot] = start
        self._ends[slot] = now
        self._kinds[slot] = self._open_kind
        self._count += 1
        self._open_start = -1
        self._edge_from = now

    def timed(self, collector: str, hook: Callable[[], Any]) -> None:
        """Run one collector hook, adding its time to ``collector_ns``."""
        began = clock.now_ns()
        try:
            hook()
        finally:
            spent = clock.now_ns() - began
            self.collector_ns[collector] = self.collector_ns.get(collector, 0) + spent

    def durations(self) -> dict[str, list[int]]:
        """The kept steps' durations (ns) by kind, oldest first."""
        found: dict[str, list[int]] = {kind: [] for kind in KINDS}
        kept = len(self)
        first = self._count - kept
        for n in range(first, self._count):
            slot = n % self.capacity
            found[KINDS[self._kinds[slot]]].append(self._ends[slot] - self._starts[slot])
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
            "edge_ns": dict(zip(KINDS, self.edge_ns, strict=True)),
            "collector_ns": dict(self.collector_ns),
            "dropped": self.dropped,
        }
