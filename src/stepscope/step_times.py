"""Every step's start and end, recorded or not, in a small bounded ring (two stamps a step).

The profile stamps a step's start when ``step()`` returns and its end when the next ``step()``
(or ``stop()``) is entered, so a step's time is the program's own loop body: the profiler's
work at the step edge (window starts, stops, trace writing) falls between steps and is kept
apart.  Each step carries the schedule's action it ran under, so a report can compare the
steps recorded with the steps not recorded of the same run (``summary``).  The ring keeps the
last ``capacity`` steps; older ones are dropped and counted.  ``begin`` and ``end`` only store
a clock reading each (the C ``StepRing`` of ``_csrc/step_times.c``, or its twin
``PyStepRing``): everything else is worked out when a summary is asked for.

The profile marks each *window edge* (a step boundary at which a window was prepared, started
or stopped, ``mark_edge``) and, when a stopped window's save ran off the loop, when that save
ended (``settle_edge``).  ``summary`` states what the edges cost the loop as an outside clock
sees it: for each edge, the steps around it — the step before, the step that ended at it, and
the steps after it up to the end of its save (at least one, at most ``MAX_AFTER``) — each
taken from its start to the next step's start (the loop body and the profiler's time at its
end), less the median of the ordinary steps of its kind (those near no edge).  That includes
the profile's stop, and a save's effect on the steps it overlapped (the GIL, the CPU).

A ring made with ``phases=True`` (for the step tables) also keeps, per step, the time spent in
each of ``PHASES`` (bracketed by ``enter``/``leave`` from the tables' hooks; nested or
overlapping brackets count once, so the collective phase — entered where a collective starts,
left on the thread that completes it — is the time any collective was in flight, counted only
while no other phase is open: data wait, optimizer and GC are the thread's own time) and the CPU
time of
the thread calling ``step()``, stored by the same ``end`` with the same clock reading; ``take``
hands the rows ended since a given step to the tables' writer thread.  The thread's CPU clock is
a system call (about 1 us on a VM), so it is read at most every ``CPU_READ_NS``: a step that
long gets its own CPU time, shorter ones share a reading's CPU time in proportion to their wall
time, and ``take`` hands over only the steps whose CPU time is settled.  ``settle`` reads the
loop thread's clock from any thread (the tables' writer thread, every 20 ms); what the open step
spent before that reading is credited to the steps it settles.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepscope import _ext
from stepscope.clock import now_ns

if TYPE_CHECKING:
    from stepscope._native import StepRing

__all__ = ["KINDS", "PHASES", "PyStepRing", "StepTimes", "Taken"]

KINDS = ("unrecorded", "warmup", "recorded")
"""What a step ran under: no profiling, the schedule's warmup, a recording window."""
PHASES = ("data_wait", "optimizer", "gc", "collective")
COLLECTIVE = 3
"""The phase counted only while no other is open."""
"""The phases a ring with ``phases=True`` times per step, by their ``enter``/``leave`` number."""

COLD_RATIO = 1.5
"""A step before the first window slower than this times the median of the unrecorded steps
after it is still the program's warm-up, not a baseline for the recorded steps."""
SETTLED_RATIO = 1.2
"""The warm unrecorded steps before the first window have settled unless each step of their
first half took more than this times their second half's median."""

_Columns = tuple["array[int]", "array[int]", bytes, range]
"""The ring's starts, ends and kinds, and the step numbers it keeps."""

MAX_AFTER = 64
"""The most steps after an edge counted as the edge's while its window is being saved."""
MAX_EDGES = 256
"""Edges kept (the oldest are forgotten; their steps have usually left the ring too)."""
LISTED_EDGES = 32
"""Edges listed one by one in a summary (the last ones; all are in its totals)."""

CPU_READ_NS = 1_000_000
"""The least wall time between two readings of the thread's CPU clock (phases only)."""

Taken = tuple[int, int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]
"""``take``'s answer: first, count, then starts, ends, kinds (uint8), data wait, optimizer, GC,
collective and CPU ns columns (int64) of the steps first..count-1."""


def _loop_thread_cpu_clock() -> tuple[Callable[[], int], int | None]:
    """This thread's CPU clock, and the only thread that may read it (None: any thread)."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):  # no per-thread clock ids: only this thread may read it
        return time.thread_time_ns, threading.get_ident()
    return functools.partial(time.clock_gettime_ns, clock), None


class PyStepRing:
    """The pure-Python twin of the C ``StepRing``: the same calls, the same export."""

    __slots__ = (
        "_count",
        "_cpu_clock",
        "_cpu_owner",
        "_cpu_read_at",
        "_deferred",
        "_depth",
        "_ends",
        "_kinds",
        "_last_cpu",
        "_open",
        "_phase_lock",
        "_phase_ns",
        "_phase_owner",
        "_phase_start",
        "_phases",
        "_settle_lock",
        "_settled",
        "_slot",
        "_starts",
        "_wide",
        "capacity",
    )

    def __init__(self, capacity: int, phases: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, got {capacity}")
        self.capacity = capacity
        self._starts = array("q", bytes(8 * capacity))
        self._ends = array("q", bytes(8 * capacity))
        self._kinds = bytearray(capacity)
        self._count = 0
        self._slot = 0
        self._open = False
        self._phases = phases
        width = len(PHASES) + 1 if phases else 0
        self._wide = [array("q", bytes(8 * capacity)) for _ in range(width)]
        self._phase_ns = [0] * len(PHASES)
        self._phase_start = [0] * len(PHASES)
        self._depth = [0] * len(PHASES)
        self._last_cpu: int | None = None
        self._cpu_read_at = 0
        self._settled = 0
        self._cpu_clock: Callable[[], int] = time.thread_time_ns
        self._cpu_owner: int | None = None
        self._settle_lock = threading.Lock()  # the writer thread settles too
        self._phase_lock = threading.Lock()  # a collective is left on another thread
        self._phase_owner = 0  # the thread inside a phase update (0: none)
        self._deferred: list[tuple[int, int]] = []  # changes made inside it by a GC callback

    def begin(self, kind: int, /) -> None:
        """A step starts now (kind 0 unrecorded, 1 warmup, 2 and more recorded)."""
        slot = self._slot
        self._kinds[slot] = 0 if kind < 0 else kind if kind < 2 else 2
        self._open = True
        now = now_ns()
        if self._phases and self._last_cpu is None:
            self._cpu_clock, self._cpu_owner = _loop_thread_cpu_clock()
            self._last_cpu, self._cpu_read_at = self._cpu_clock(), now
        self._starts[slot] = now

    def end(self) -> None:
        """The open step ends now (none open: nothing)."""
        if self._open:
            now = now_ns()
            slot = self._slot
            self._ends[slot] = now
            if self._phases:
                self._owned(self._cut, now, slot)
            self._open = False
            self._count += 1
            self._slot = self._count % self.capacity
            if self._phases and now - self._cpu_read_at >= CPU_READ_NS:
                self._settle_at(now)

    def settle(self) -> None:
        """Read the CPU clock of the thread that began the first step now (from any thread):
        every ended step's CPU time is then settled."""
        if self._phases and self._last_cpu is not None:
            self._settle_at(now_ns())

    def _settle_at(self, now: int) -> None:
        owner = self._cpu_owner
        if owner is not None and owner != threading.get_ident():
            return  # this thread's clock is not the loop's
        with self._settle_lock:
            count = self._count
            if self._settled == count:
                return
            try:
                cpu = self._cpu_clock()
            except OSError:  # the thread has ended: the steps get 0, not a made-up value
                cpu = self._last_cpu or 0
            spent = cpu - (self._last_cpu or 0)
            wall = self._ends[(count - 1) % self.capacity] - self._cpu_read_at
            previous, cpu_column = self._cpu_read_at, self._wide[-1]
            for n in range(max(self._settled, count - self.capacity), count):
                slot = n % self.capacity
                interval, previous = self._ends[slot] - previous, self._ends[slot]
                cpu_column[slot] = int(spent * interval / wall) if wall > 0 else 0
            self._settled, self._last_cpu, self._cpu_read_at = count, cpu, now

    def enter(self, phase: int, /) -> None:
        """Phase 0 data wait, 1 optimizer, 2 GC, 3 collective begins (nested or overlapping:
        counted once)."""
        if not 0 <= phase < len(PHASES):
            raise ValueError(f"phase must be 0 to {len(PHASES) - 1}, got {phase}")
        self._owned(self._move, phase, 1)

    def leave(self, phase: int, /) -> None:
        """The phase entered last ends now."""
        if not 0 <= phase < len(PHASES):
            raise ValueError(f"phase must be 0 to {len(PHASES) - 1}, got {phase}")
        self._owned(self._move, phase, -1)

    def _owned(self, change: Callable[[int, int], None], a: int, b: int) -> None:
        """``change(a, b)`` under the phase lock.  A GC callback run inside this thread's own
        change (Python code allocates, and a collection calls the program's callbacks there)
        would wait for a lock its own thread holds: its change is made right after instead."""
        me = threading.get_ident()
        if self._phase_owner == me:
            self._deferred.append((a, b))
            return
        with self._phase_lock:
            self._phase_owner = me
            try:
                change(a, b)
                while self._deferred:
                    phase, by = self._deferred.pop(0)
                    self._move(phase, by)
            finally:
                self._phase_owner = 0

    def _cut(self, now: int, slot: int) -> None:
        """The step boundary at ``now``: each phase's time so far goes to row ``slot``."""
        for k in range(len(PHASES)):
            if self._counting(k):  # open across the boundary: split it
                self._phase_ns[k] += now - self._phase_start[k]
                self._phase_start[k] = now
            self._wide[k][slot] = self._phase_ns[k]
            self._phase_ns[k] = 0

    # _counting and _move allocate no container: a collection there would run the program's
    # GC callbacks (step tables' own among them) inside the update they would make again.
    def _counting(self, phase: int) -> bool:
        """Whether ``phase`` is counted now: open, and for the collective, no other open."""
        depth = self._depth
        if not depth[phase]:
            return False
        if phase == COLLECTIVE:
            for k in range(len(PHASES)):
                if k != COLLECTIVE and depth[k]:
                    return False
        return True

    def _move(self, phase: int, by: int) -> None:
        """Change ``phase``'s depth, starting or stopping each count that changes with it (a
        phase not open is not left)."""
        depth = self._depth
        if by < 0 and not depth[phase]:
            return
        was_open, collective_was = depth[phase] > 0, self._counting(COLLECTIVE)
        depth[phase] += by
        now = 0
        if phase != COLLECTIVE and (depth[phase] > 0) != was_open:
            now = now_ns()
            self._flip(phase, not was_open, now)
        if self._counting(COLLECTIVE) != collective_was:
            self._flip(COLLECTIVE, not collective_was, now or now_ns())

    def _flip(self, phase: int, starts: bool, now: int) -> None:
        """``phase``'s count starts (or stops, adding its time) at ``now``."""
        if starts:
            self._phase_start[phase] = now
        else:
            self._phase_ns[phase] += now - self._phase_start[phase]

    def take(self, since: int, /) -> Taken:
        """The rows of the steps ended since step ``since`` (see ``Taken``; phases only)."""
        if not self._phases:
            raise RuntimeError("take() needs a StepRing made with phases=True")
        count = self._settled  # read first: rows below it are complete
        first = min(max(since, 0, self._count - self.capacity), count)

        def cut(column: array[int] | bytearray) -> bytes:  # unwrapped: oldest row first
            lo, n = first % self.capacity, count - first
            return bytes(column[lo : lo + n]) + bytes(column[: max(0, lo + n - self.capacity)])

        starts, ends, kinds = cut(self._starts), cut(self._ends), cut(self._kinds)
        data, optimizer, gc_ns, collective, cpu = (cut(column) for column in self._wide)
        return first, count, starts, ends, kinds, data, optimizer, gc_ns, collective, cpu

    def export(self) -> tuple[bytes, bytes, bytes, int]:
        """(starts, ends, kinds, count): int64 and uint8 columns of the ring, steps ended."""
        return self._starts.tobytes(), self._ends.tobytes(), bytes(self._kinds), self._count


class StepTimes:
    """The step hook (``begin``/``end``: the C ``StepRing`` or its twin, whichever the
    process-wide implementation choice gives) and what the ring holds, summarised."""

    __slots__ = (
        "_cut",
        "_edges",
        "begin",
        "capacity",
        "collector_ns",
        "end",
        "first_step",
        "ring",
    )

    def __init__(
        self, capacity: int = 8192, implementation: str | None = "auto", phases: bool = False
    ) -> None:
        native = _ext.resolve(implementation, what="step times")
        ring = native.StepRing if native is not None else PyStepRing
        self.ring: PyStepRing | StepRing = ring(capacity, phases)
        self.capacity = capacity
        self.begin: Callable[[int], None] = self.ring.begin
        """A step starts now; ``kind`` is the schedule action's value (0 none, 1 warmup, 2 and
        3 recording)."""
        self.end: Callable[[], None] = self.ring.end
        """The open step ends now (nothing happens when none is open)."""
        self.collector_ns: dict[str, int] = {}  # each collector's time in its hooks
        self.first_step = 0
        """The step number of the ring's first step (the profile's step at its start)."""
        self._edges: OrderedDict[int, int | None] = OrderedDict()
        """Window edges by the index of the step that ended at them: when their save ended
        (0: nothing was saved off the loop; None: still saving)."""
        self._cut: OrderedDict[int, None] = OrderedDict()
        """The indexes of steps a stop or pause cut short (the last ``MAX_EDGES``)."""

    def cut_short(self) -> None:
        """The open step ends now, cut short by a stop or pause (the program's tail after its
        last step, not a step): its row stays, its time enters no duration or median."""
        count = self.ring.export()[3]
        self.ring.end()
        if self.ring.export()[3] > count:
            self._cut[count] = None
            while len(self._cut) > MAX_EDGES:
                self._cut.popitem(last=False)

    def mark_edge(self, saving: bool = False) -> int:
        """A window edge right after the last ended step; returns that step's index (-1 before
        the first step).  ``saving``: a window stopped there is being saved off the loop."""
        index = self.ring.export()[3] - 1
        if index >= 0:
            self._edges[index] = None if saving else 0
            self._edges.move_to_end(index)
            while len(self._edges) > MAX_EDGES:
                self._edges.popitem(last=False)
        return index

    def settle_edge(self, index: int, saving: bool = False) -> None:
        """The save of the window stopped at edge ``index`` ended now (``saving``: it begins,
        so the edge counts the steps after it until then)."""
        if index in self._edges:
            self._edges[index] = None if saving else now_ns()

    @property
    def dropped(self) -> int:
        """Steps no longer kept (the ring holds the last ``capacity``)."""
        return max(0, self.ring.export()[3] - self.capacity)

    def __len__(self) -> int:
        return min(self.ring.export()[3], self.capacity)

    def _columns(self) -> _Columns:
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
        return self._durations(self._columns())

    def _durations(self, columns: _Columns) -> dict[str, list[int]]:
        starts, ends, kinds, kept = columns
        found: dict[str, list[int]] = {kind: [] for kind in KINDS}
        for n in kept:
            if n not in self._cut:
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

    def warm_unrecorded(self) -> tuple[list[int], int, bool]:
        """The unrecorded steps a recorded one may be compared with: (their durations, how many
        cold first steps were left out, whether those before the first window had settled).

        The run's first step is cold (first calls, the allocator's first blocks, lazy imports);
        so is each following step before the first window while it takes more than
        ``COLD_RATIO`` times the median of the unrecorded steps after it.  What is left before
        the first window has *settled* unless every step of its first half took more than
        ``SETTLED_RATIO`` times its second half's median (the loop is still getting faster)."""
        return self._warm_unrecorded(self._columns())

    def _warm_unrecorded(self, columns: _Columns) -> tuple[list[int], int, bool]:
        starts, ends, kinds, kept = columns
        before: list[int] = []  # unrecorded steps before the first warmup or recorded step
        after: list[int] = []
        windowed = False
        for n in kept:
            slot = n % self.capacity
            windowed = windowed or kinds[slot] != 0
            if kinds[slot] == 0 and n not in self._cut:
                (after if windowed else before).append(ends[slot] - starts[slot])
        cold = 0
        if kept.start == 0 and before:
            cold = 1  # the run's first step
            while cold < len(before) - 1 and before[cold] > COLD_RATIO * statistics.median(
                before[cold + 1 :]
            ):
                cold += 1
        warm = before[cold:]
        settled = True
        if len(warm) >= 3:
            half = len(warm) // 2
            settled = min(warm[:half]) <= SETTLED_RATIO * statistics.median(warm[half:])
        if not settled and after:  # the steps between windows are warm: compare with those
            return after, cold + len(warm), True
        return warm + after, cold, settled

    def summary(self) -> dict[str, Any]:
        """Per kind: count, median and mean ns (unrecorded: the warm ones, ``warm_unrecorded``);
        the recorded steps' slowdown over the warm unrecorded ones (``slowdown_pct``, None
        without both or before they settled); edge time; drops.  Plain JSON values."""
        columns = self._columns()  # the ring read once for both
        durations = self._durations(columns)
        warm, cold, settled = self._warm_unrecorded(columns)
        durations["unrecorded"] = warm
        kinds: dict[str, dict[str, Any]] = {}
        for kind, values in durations.items():
            kinds[kind] = {
                "count": len(values),
                "median_ns": int(statistics.median(values)) if values else None,
                "mean_ns": int(statistics.fmean(values)) if values else None,
            }
        kinds["unrecorded"]["cold"] = cold
        kinds["unrecorded"]["settled"] = settled
        recorded = kinds["recorded"]["median_ns"]
        unrecorded = kinds["unrecorded"]["median_ns"]
        slowdown = (
            100.0 * (recorded - unrecorded) / unrecorded
            if recorded is not None and unrecorded and settled
            else None
        )
        return {
            "steps": kinds,
            "slowdown_pct": slowdown,
            "edges": self._edge_cost(columns, cold),
            "edge_ns": self.edges(),
            "collector_ns": dict(self.collector_ns),
            "dropped": self.dropped,
        }

    def _edge_cost(self, columns: _Columns, cold: int) -> dict[str, Any]:
        """What the window edges cost the loop (see the module docstring): their count, the
        extra ns of their steps, how many are still being saved, the last ones listed as
        ``[step, first step, last step, extra ns]``."""
        starts, ends, kinds, kept = columns
        count, capacity = kept.stop, self.capacity

        def iteration(n: int) -> int:  # start to the next start (to its end for the last)
            following = starts[(n + 1) % capacity] if n + 1 < count else ends[n % capacity]
            return following - starts[n % capacity]

        def after_end(k: int, settled: int | None) -> int:
            if settled is None:  # still saving: every step so far
                return min(count - 1, k + MAX_AFTER)
            n = k + 1
            while (
                n + 1 < count
                and n < k + MAX_AFTER
                and settled > 0
                and (starts[(n + 1) % capacity] < settled)
            ):
                n += 1
            return min(n, count - 1)

        marks = [(k, v) for k, v in list(self._edges.items()) if kept.start <= k < count]
        spans = [(k, max(k - 1, kept.start), after_end(k, v)) for k, v in marks]
        near = {n for _, lo, hi in spans for n in range(lo, hi + 1)}
        ordinary: dict[int, list[int]] = {0: [], 1: [], 2: []}
        for n in kept[cold:]:
            if n not in near and n + 1 < count:
                ordinary[kinds[n % capacity]].append(iteration(n))
        everything = [t for values in ordinary.values() for t in values]
        base: dict[int, int | None] = {}
        for kind, fallbacks in ((0, (0, 2, 1)), (1, (1, 0, 2)), (2, (2, 0, 1))):
            found = next((ordinary[f] for f in fallbacks if ordinary[f]), everything)
            base[kind] = int(statistics.median(found)) if found else None
        if not marks or base[0] is None:
            return {"count": len(marks), "extra_ns": None, "saving": 0, "listed": []}

        def extra(n: int) -> int:
            return iteration(n) - (base[kinds[n % capacity]] or 0)

        listed = [
            [self.first_step + k, self.first_step + lo, self.first_step + hi,
             sum(extra(n) for n in range(lo, hi + 1))]
            for k, lo, hi in spans[-LISTED_EDGES:]
        ]  # fmt: skip
        return {
            "count": len(marks),
            "extra_ns": sum(extra(n) for n in near),
            "saving": sum(1 for _, v in marks if v is None),
            "listed": listed,
        }
