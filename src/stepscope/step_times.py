"""Every step's start and end, recorded or not, in a small bounded ring (two stamps a step).

The profile stamps a step's start when ``step()`` returns and its end when the next ``step()``
(or ``stop()``) is entered, so a step's time is the program's own loop body: the profiler's
work at the step edge (window starts, stops, trace writing) falls between steps and is kept
apart.  Each step carries the schedule's action it ran under, so a report can compare the
steps recorded with the steps not recorded of the same run (``summary``).  The ring keeps the
last ``capacity`` steps; older ones are dropped and counted.  ``begin`` and ``end`` only store
a clock reading each (the C ``StepRing`` of ``_csrc/step_times.c``, or its twin
``PyStepRing``): everything else is worked out when a summary is asked for.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepscope import _ext
from stepscope.clock import now_ns

if TYPE_CHECKING:
    from stepscope._native import StepRing

__all__ = ["KINDS", "PyStepRing", "StepTimes"]

KINDS = ("unrecorded", "warmup", "recorded")
"""What a step ran under: no profiling, the schedule's warmup, a recording window."""


class PyStepRing:
    """The pure-Python twin of the C ``StepRing``: the same calls, the same export."""

    __slots__ = ("_count", "_ends", "_kinds", "_open", "_slot", "_starts", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, got {capacity}")
        self.capacity = capacity
        self._starts = array("q", bytes(8 * capacity))
        self._ends = array("q", bytes(8 * capacity))
        self._kinds = bytearray(capacity)
        self._count = 0
        self._slot = 0
        self._open = False

    def begin(self, kind: int, /) -> None:
        """A step starts now (kind 0 unrecorded, 1 warmup, 2 and more recorded)."""
        slot = self._slot
        self._kinds[slot] = 0 if kind < 0 else kind if kind < 2 else 2
        self._open = True
        self._starts[slot] = now_ns()

    def end(self) -> None:
        """The open step ends now (none open: nothing)."""
        if self._open:
            self._ends[self._slot] = now_ns()
            self._open = False
            self._count += 1
            self._slot = self._count % self.capacity

    def export(self) -> tuple[bytes, bytes, bytes, int]:
        """(starts, ends, kinds, count): int64 and uint8 columns of the ring, steps ended."""
        return self._starts.tobytes(), self._ends.tobytes(), bytes(self._kinds), self._count


class StepTimes:
    """The step hook (``begin``/``end``: the C ``StepRing`` or its twin, whichever the
    process-wide implementation choice gives) and what the ring holds, summarised."""

    __slots__ = ("begin", "capacity", "collector_ns", "end", "ring")

    def __init__(self, capacity: int = 8192, implementation: str | None = "auto") -> None:
        native = _ext.resolve(implementation, what="step times")
        self.ring: PyStepRing | StepRing = (
            native.StepRing(capacity) if native is not None else PyStepRing(capacity)
        )
        self.capacity = capacity
        self.begin: Callable[[int], None] = self.ring.begin
        """A step starts now; ``kind`` is the schedule action's value (0 none, 1 warmup, 2 and
        3 recording)."""
        self.end: Callable[[], None] = self.ring.end
        """The open step ends now (nothing happens when none is open)."""
        self.collector_ns: dict[str, int] = {}  # each collector's time in its hooks

    @property
    def dropped(self) -> int:
        """Steps no longer kept (the ring holds the last ``capacity``)."""
        return max(0, self.ring.export()[3] - self.capacity)

    def __len__(self) -> int:
        return min(self.ring.export()[3], self.capacity)

    def _columns(self) -> tuple[array[int], array[int], bytes, range]:
        starts_b, ends_b, kinds, count = self.ring.export()
        starts, ends = array("q"), array("q")
        starts.frombytes(starts_b)
        ends.frombytes(ends_b)
        return starts, ends, kinds, range(count - min(count, self.capacity), count)

    def timed(self, collector: str, hook: Callable[[], Any]) -> None:
        """Run one collector hook, adding its time to ``collector_ns``."""
        began = now_ns()
        try:
            hook()
        finally:
            spent = now_ns() - began
            self.collector_ns[collector] = self.collector_ns.get(collector, 0) + spent

    def durations(self) -> dict[str, list[int]]:
        """The kept steps' durations (ns) by kind, oldest first."""
        starts, ends, kinds, kept = self._columns()
        found: dict[str, list[int]] = {kind: [] for kind in KINDS}
        for n in kept:
            slot = n % self.capacity
            found[KINDS[kinds[slot]]].append(ends[slot] - starts[slot])
        return found

    def edges(self) -> dict[str, int]:
        """Time between a kept step's end and the next one's start, by the ended step's kind."""
        starts, ends, kinds, kept = self._columns()
        found = dict.fromkeys(KINDS, 0)
        for n in kept[:-1]:
            slot, following = n % self.capacity, (n + 1) % self.capacity
            found[KINDS[kinds[slot]]] += starts[following] - ends[slot]
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
