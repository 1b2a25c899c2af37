"""The step tables' recorder: one row per step, taken from the profile's step ring.

The profile's ``step_times`` ring (made by ``StepTables.step_times``, with phases) already stamps
every step's start and end; with phases it also stores each step's data-wait, optimizer, GC and
collective time and its CPU time, with the same clock reading.  So the tables add no hook to
``step()``: their hooks only open and close phases on the ring (the DataLoader iterator's
``__next__``, wrapped on its class; the optimizer step, through the process's one optimizer hook
dispatcher; ``gc.callbacks``; host collectives, through the process's one collective hook), and
the writer thread takes the new rows every 20 ms.  A device collective's time (NCCL: its start
and end events) is known only once it completed: the writer thread adds it to the step that
launched it, and takes no row from that step on until then.  Rows of recorded steps wait for
their window's trace; a killed rank loses at most its open row group.
"""

from __future__ import annotations

import functools
import gc
import os
import re
import socket
import threading
from array import array
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope import clock
from stepscope.atomic import make_directory
from stepscope.collectors import collective_hook, import_watch, optimizer_hook
from stepscope.collectors.base import Collector
from stepscope.config import config
from stepscope.distributed import rank_and_world_size
from stepscope.extras import require
from stepscope.failures import failure_log
from stepscope.step_times import StepTimes
from stepscope.steptables.schema import partition_value
from stepscope.steptables.writer import Rows, TableWriter
from stepscope.trace.model import Trace

__all__ = [
    "DEFAULT_ROWS_PER_FILE",
    "RING_STEPS",
    "NoStepTables",
    "StepTables",
    "default_run",
    "step_tables_of",
]

DEFAULT_ROWS_PER_FILE = 8192
"""Steps per row group (and file) at most: a file has a fixed cost of about 1 ms to write."""
DEFAULT_FLUSH_S = 60.0
"""A row group is written once its first step is this old: with ``rows_per_file``, what a killed
rank can lose at most."""
RING_STEPS = 1 << 15
"""Steps the profile's ring keeps with step tables: the writer thread, taking rows every 20 ms,
falls behind (and counts the rows lost) only past 1.6 million steps a second."""
DATA, OPTIMIZER, GC, COLLECTIVE = 0, 1, 2, 3
"""The ring's phase numbers (``step_times.PHASES``)."""
DEVICE_PENDING = 4096
"""Device collectives waiting for their completion at most (more are not timed, and counted)."""
DEVICE_WAIT_NS = 10_000_000_000
"""How long rows wait for a device collective launched in their step: one still running after
this (a hang, a rank that never joined) is not timed, and counted."""
_RUNS = re.compile(rb"\x02+|[^\x02]+")  # kind 2: a recorded step
_failures = failure_log("step_tables")


def default_run() -> str:
    """The run id every rank agrees on without talking: ``config.run_name``, torchrun's
    ``TORCHELASTIC_RUN_ID``, else ``default``."""
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return config.run_name or (elastic if elastic not in ("", "none") else "default")


class StepTables(Collector):
    """Writes one row per step of this rank into ``directory/run=<run>/rank=<rank>/``.

    A collector only to be given each window's trace (``window_built``): the rows of the
    steps a window recorded wait for it and are written with their host breakdown.
    """

    name = "step_tables"
    collects_off_loop = True  # collects nothing; its window_built takes its lock

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rows_per_file: int = DEFAULT_ROWS_PER_FILE,
        flush_s: float = DEFAULT_FLUSH_S,
        run: str | None = None,
        strict: bool | None = None,
    ) -> None:
        if isinstance(rows_per_file, bool) or not isinstance(rows_per_file, int):
            raise TypeError(f"rows_per_file must be an int, got {rows_per_file!r}")
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be 1 or more, got {rows_per_file}")
        if isinstance(flush_s, bool) or not isinstance(flush_s, (int, float)) or flush_s <= 0:
            raise ValueError(f"flush_s must be a number of seconds above 0, got {flush_s!r}")
        require("pyarrow", "step tables (profile(step_tables=...))", "parquet")
        self.directory = Path(os.fspath(directory))
        self.rows_per_file = rows_per_file
        self.flush_ns = int(flush_s * 1e9)
        self.run = run
        self.strict = strict
        self.path: Path | None = None
        """The rank's partition directory, once started."""
        self._writer: TableWriter | None = None
        self._undo: list[Callable[[], None]] = []
        self._active = False
        self._ring: Any = None  # the followed profile's StepRing (or its twin)
        self._step_now: Callable[[], int] = lambda: 0
        self._first_step = self._first_index = self._next = 0
        self._lock = threading.Lock()  # the writer thread and window_built both take rows
        self._pending = Rows()
        self._held = Rows(recorded=True)
        """Rows of recorded steps, until their window's trace is built."""
        self._lost = 0
        self._device: deque[tuple[int, int, Any]] = deque()
        """Device collectives not yet complete: (step launched in, launch ns, work)."""
        self._device_ns: dict[int, int] = {}
        """Device collective time of steps not yet taken, by step."""
        self.untimed_collectives = 0
        """Device collectives not timed (too many waiting, too long, no duration)."""

    @property
    def dropped_rows(self) -> int:
        """Rows lost because the writer thread fell behind (0 normally)."""
        return self._lost + (self._writer.dropped_rows if self._writer is not None else 0)

    def step_times(self) -> StepTimes:
        """The profile's step ring: with the phase columns these tables are made from."""
        return StepTimes(RING_STEPS, phases=True)

    def begin(self) -> None:
        """Open the rank's directory, start the writer thread and the hooks."""
        if self._active:
            return
        rank = rank_and_world_size()[0] or 0
        run = partition_value(self.run or default_run())
        try:
            self.path = make_directory(
                self.directory / f"run={run}" / f"rank={rank}",
                "step tables",
                "step tables directory",
            )
        except OSError as exc:
            # the program runs on without its tables (re-raised under strict)
            _failures.report(
                type(exc).__name__,
                "step tables directory",
                exc,
                strict=self.strict,
                message="no step tables",
                then="this profile writes none; the program runs on",
            )
            return
        self._ring = None
        self._pending, self._held = Rows(), Rows(recorded=True)
        host, base = socket.gethostname(), clock.wall_base_ns()
        self._writer = TableWriter(self.path, host, base, self._take)
        self._active = True
        gc.callbacks.append(self._on_gc)
        self._undo.append(lambda: gc.callbacks.remove(self._on_gc))
        import_watch.when_imported("torch.utils.data", self._hook_dataloader)
        import_watch.when_imported("torch.optim", self._hook_optimizer)
        collective_hook.add_listener(self)
        self._undo.append(lambda: collective_hook.remove_listener(self))

    def follow(self, step_times: StepTimes, step_now: Callable[[], int]) -> None:
        """Take rows from ``step_times``'s ring from now on; ``step_now()`` is the profile's
        current step (the next ring row's number; at the end, the unfinished one)."""
        ring = step_times.ring
        self._first_index = self._next = ring.take(1 << 62)[1]
        self._first_step, self._step_now = step_now(), step_now
        self._device.clear()
        self._device_ns.clear()
        self._ring = ring

    def close(self) -> None:
        """Hand the last rows to the writer, remove the hooks, wait for the files."""
        if not self._active:
            return
        self._active = False
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        import_watch.cancel("torch.utils.data", self._hook_dataloader)
        import_watch.cancel("torch.optim", self._hook_optimizer)
        writer = self._writer
        if writer is None:
            return
        with self._lock:
            self._settle()
            self._take_locked(final=True)
            self._hand_over(self._held, None)  # recorded steps whose window was never built
            self._hand_over(self._pending, None)
            self.untimed_collectives += len(self._device) + len(self._device_ns)
            self._device.clear()  # works still running: not timed, and not kept alive
            self._device_ns.clear()
        self._ring = None
        writer.close()

    def collectors(self) -> list[Collector]:
        """What the profile adds to its collectors: this, for ``window_built``."""
        return [self]

    def window_built(self, trace: Trace) -> None:
        """Hand the held rows of the window's steps to the writer with the window's trace."""
        with self._lock:
            self._settle()
            self._take_locked(final=True)
            self._hand_over(self._held, trace)

    # -- rows: from the ring to the writer --------------------------------------------------
    def _settle(self) -> None:
        """Settle the CPU time of every ended step (the ring reads the loop thread's clock)."""
        if self._ring is not None:
            self._ring.settle()

    def _take(self) -> None:
        with self._lock:
            self._settle()
            self._take_locked(final=False)

    def _take_locked(self, final: bool) -> None:
        """Move the ring's new rows into the open row group or the held ones.  A group is
        handed over once a row after it is seen, full or ``flush_s`` old (``final``: at a
        window's end or the profile's stop), so the unfinished step a stop ends is never
        written."""
        ring, writer = self._ring, self._writer
        if ring is None or writer is None:
            return
        waiting = self._time_device(final)
        first, count, *raw = ring.take(self._next)
        self._lost += first - self._next
        base = self._first_step + first - self._first_index
        if waiting is not None:  # no row from the step a device collective runs in
            count = first + max(0, min(count - first, waiting - base))
        self._next = count
        if count > first:
            n = count - first
            kinds = raw[2][:n]
            new = Rows()
            new.columns[0].extend(range(base, base + n))
            # the ring's starts, ends, data, optimizer, GC, collective, CPU: RAW_COLUMNS 1-7
            for column, data in zip(new.columns[1:8], (raw[0], raw[1], *raw[3:]), strict=True):
                column.frombytes(data[: 8 * n])
            new.columns[8].extend(array("q", [writer.rss]) * n)
            if self._device_ns:
                collective = new.columns[6]
                for i in range(n):
                    collective[i] += self._device_ns.pop(base + i, 0)
                late = [step for step in self._device_ns if step < base + n]
                for step in late:  # completed after its step's row was taken (at a window)
                    del self._device_ns[step]
                self.untimed_collectives += len(late)
            for run in _RUNS.finditer(kinds):
                into = self._held if run.group()[0] == 2 else self._pending
                into.extend(new, run.start(), run.end())
        if final:
            unfinished = self._step_now()
            self._held.before_step(unfinished)
            self._pending.before_step(unfinished)
        now = clock.now_ns()
        for rows in (self._pending, self._held):  # the held: a window that never ends
            while len(rows) > self.rows_per_file:
                writer.submit(rows.split(self.rows_per_file))
            if len(rows) > 1 and now - rows.columns[1][0] >= self.flush_ns:
                writer.submit(rows.split(len(rows) - 1))  # the last: maybe a stop's unfinished

    def _time_device(self, final: bool) -> int | None:
        """Credit each completed device collective's time to the step that launched it; the
        step of the oldest one still running, whose row must wait (None: none, or ``final``:
        at a window's end or the close every row is taken, and a collective that completes
        later is not timed)."""
        pending, now = self._device, clock.now_ns()
        while pending:
            step, launched, work = pending[0]
            try:
                done = work.is_completed()
                if done:
                    self._device_ns[step] = self._device_ns.get(step, 0) + int(
                        work._get_duration() * 1e6  # ms, from its start and end events
                    )
            except Exception as exc:  # a backend without durations: counted, logged once
                done = True
                self.untimed_collectives += 1
                _failures.report(
                    type(exc).__name__,
                    "device collective time",
                    exc,
                    strict=False,
                    then="that collective is not in collective_ns",
                )
            if not done and now - launched < DEVICE_WAIT_NS:
                return None if final else step
            pending.popleft()
            if not done:
                self.untimed_collectives += 1
        return None

    # -- collectives: collective_hook's listener --------------------------------------------
    def collective_started(self) -> Callable[[], None] | None:
        """A host collective starts: the ring's collective phase is open until it completes."""
        ring = self._ring
        if ring is None:
            return None
        ring.enter(COLLECTIVE)
        return functools.partial(ring.leave, COLLECTIVE)

    def device_collective(self, work: Any) -> None:
        """A device collective was launched in the current step: timed once it completes."""
        if self._ring is None:
            return
        if len(self._device) >= DEVICE_PENDING:
            self.untimed_collectives += 1
            return
        self._device.append((self._step_now(), clock.now_ns(), work))

    def _hand_over(self, rows: Rows, trace: Trace | None) -> None:
        if len(rows) and self._writer is not None:
            self._writer.submit(rows.split(len(rows)), trace)

    # -- hooks: each only opens or closes a phase on the ring --------------------------------
    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        ring = self._ring
        if ring is not None:
            (ring.enter if phase == "start" else ring.leave)(GC)

    def _before_optimizer_step(self, optimizer: Any) -> None:
        ring = self._ring
        if ring is not None:
            ring.enter(OPTIMIZER)

    def _after_optimizer_step(self, optimizer: Any) -> None:
        # a subclass's step() calling super().step() runs both nested: the ring counts once
        ring = self._ring
        if ring is not None:
            ring.leave(OPTIMIZER)

    def _hook_optimizer(self) -> None:
        optimizer_hook.add_listener(self._before_optimizer_step, strict=self.strict, before=True)
        optimizer_hook.add_listener(self._after_optimizer_step, strict=self.strict)

        def remove() -> None:
            optimizer_hook.remove_listener(self._before_optimizer_step)
            optimizer_hook.remove_listener(self._after_optimizer_step)

        self._undo.append(remove)

    def _hook_dataloader(self) -> None:
        from torch.utils.data import dataloader

        cls: Any = dataloader._BaseDataLoaderIter
        original = cls.__dict__["__next__"]

        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:
            ring = self._ring
            if ring is None:
                return original(iterator)
            ring.enter(DATA)  # nested in another __next__: the ring counts the outer one
            try:
                return original(iterator)
            finally:
                ring.leave(DATA)

        cls.__next__ = __next__

        def restore() -> None:
            if cls.__dict__.get("__next__") is __next__:  # unless someone wrapped it after us
                cls.__next__ = original

        self._undo.append(restore)


class NoStepTables:
    """What a profile without step tables calls: nothing happens."""

    path = None
    dropped_rows = 0

    def collectors(self) -> list[Collector]:
        """None to add."""
        return []

    def step_times(self) -> StepTimes:
        """The profile's plain step ring."""
        return StepTimes()

    def begin(self) -> None:
        """Nothing to open."""

    def follow(self, step_times: StepTimes, step_now: Callable[[], int]) -> None:
        """Nothing to take rows from."""

    def close(self) -> None:
        """Nothing to close."""


def step_tables_of(
    value: str | os.PathLike[str] | StepTables | None, strict: bool | None
) -> StepTables | NoStepTables:
    """The recorder for ``profile(step_tables=value)``: a directory, a ``StepTables``, or None."""
    if value is None:
        return NoStepTables()
    if isinstance(value, StepTables):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"step_tables must be a directory or a StepTables, got {value!r}")
    return StepTables(value, strict=strict)
