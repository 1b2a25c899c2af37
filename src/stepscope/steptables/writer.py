"""The step tables' background thread: writes each full row group as one Parquet file and
samples the RSS, so the training loop's ``step()`` only stores numbers."""

from __future__ import annotations

import os
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.atomic import atomic_output
from stepscope.extras import require
from stepscope.failures import failure_log
from stepscope.steptables.schema import INT_COLUMNS, SCHEMA_VERSION, arrow_schema
from stepscope.trace.model import Trace

if TYPE_CHECKING:  # the analysis is imported only when a window's rows are written
    from stepscope.steptables.breakdown import StepBreakdown

__all__ = ["RowGroup", "TableWriter", "WindowRows"]

RSS_PERIOD_S = 0.02
"""How often the writer thread samples the RSS the rows carry."""
MAX_PENDING = 4
"""Row groups waiting to be written before new rows are dropped (and counted)."""
NCOLS = len(INT_COLUMNS)
_failures = failure_log("step_tables")


@dataclass
class RowGroup:
    """A preallocated block of rows: int columns row-major in ``ints``, ``recorded`` flags."""

    capacity: int
    ints: array[int] = field(init=False)
    recorded: bytearray = field(init=False)
    rows: int = 0

    def __post_init__(self) -> None:
        self.ints = array("q", bytes(8 * NCOLS * self.capacity))
        self.recorded = bytearray(self.capacity)


@dataclass
class WindowRows:
    """The recorded rows of one trace window and its trace (None: no trace was built)."""

    group: RowGroup
    trace: Trace | None


def _read_rss() -> int:
    """Resident bytes of this process (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class TableWriter:
    """Writes row groups handed over by ``submit`` into ``directory`` on its own thread."""

    def __init__(self, directory: Path, host: str, capacity: int) -> None:
        self.directory = directory
        self.host = host
        self.pid = os.getpid()
        self.capacity = capacity
        self.rss = _read_rss()
        """The latest RSS sample (read by the recorder at every step)."""
        self.files_written = 0
        self._token = time.time_ns()  # two profiles of one process never write the same name
        self.dropped_rows = 0
        """Rows lost because the writer fell ``MAX_PENDING`` row groups behind."""
        self._queue: deque[RowGroup | WindowRows] = deque()
        self._free: deque[RowGroup] = deque([RowGroup(capacity)])
        self._allocated = 1
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(
            target=self._loop, name="stepscope-step-tables", daemon=True
        )
        self._thread.start()

    def fresh(self) -> RowGroup | None:
        """An empty row group to fill, or None when the writer is too far behind."""
        if self._free:
            return self._free.popleft()
        if self._allocated <= MAX_PENDING:
            self._allocated += 1
            return RowGroup(self.capacity)
        return None

    def submit(self, group: RowGroup) -> None:
        """Queue a row group for writing (called by the recorder when one is full)."""
        self._queue.append(group)
        self._wake.set()

    def submit_window(self, group: RowGroup, trace: Trace | None) -> None:
        """Queue a trace window's recorded rows, to be written with its breakdown."""
        self._queue.append(WindowRows(group, trace))
        self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the thread."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            self._wake.wait(RSS_PERIOD_S)
            self._wake.clear()
            self.rss = _read_rss()
            while self._queue:
                item = self._queue.popleft()
                if isinstance(item, WindowRows):
                    self._write_guarded(item.group, item.trace)
                    continue
                self._write_guarded(item, None)
                item.rows = 0
                self._free.append(item)
            if self._closing:
                return

    def _write_guarded(self, group: RowGroup, trace: Trace | None) -> None:
        try:
            self._write(group, self._breakdown(trace))
        except Exception as exc:
            _failures.report(
                type(exc).__name__,
                "step tables writer",
                exc,
                strict=False,  # on this thread nobody could catch it
                then=f"{group.rows} step rows lost; later row groups are still tried",
            )

    def _breakdown(self, trace: Trace | None) -> dict[int, StepBreakdown]:
        if trace is None:
            return {}
        from stepscope.steptables.breakdown import window_breakdown  # analysis: only here

        try:
            return window_breakdown(trace)
        except Exception as exc:
            _failures.report(
                type(exc).__name__,
                "step tables window breakdown",
                exc,
                strict=False,
                then="the window's rows are written without it",
            )
            return {}

    def _write(self, group: RowGroup, breakdown: dict[int, StepBreakdown]) -> None:
        pa = require("pyarrow", "step tables", "parquet")
        pq = require("pyarrow.parquet", "step tables", "parquet")

        n = group.rows
        if n == 0:
            return
        ints = group.ints
        columns = [
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(ints[i : n * NCOLS : NCOLS])])
            for i in range(NCOLS)
        ]
        flags = pa.py_buffer(bytes(group.recorded[:n]))
        columns += [
            pa.Array.from_buffers(pa.uint8(), n, [None, flags]).cast(pa.bool_()),
            pa.array([self.host] * n, type=pa.string()),
            pa.array([self.pid] * n, type=pa.int32()),
            pa.array([SCHEMA_VERSION] * n, type=pa.int16()),
        ]
        found = [breakdown.get(ints[i * NCOLS]) for i in range(n)] if breakdown else [None] * n
        for part in ("computation_ns", "communication_ns", "idle_ns"):
            values = [getattr(b, part) if b is not None else None for b in found]
            columns.append(pa.array(values, type=pa.int64()))
        categories = [list(b.categories.items()) if b is not None else None for b in found]
        columns.append(pa.array(categories, type=pa.map_(pa.string(), pa.int64())))
        table = pa.Table.from_arrays(columns, schema=arrow_schema())
        first = group.ints[0]
        name = f"steps-{first:010d}-{self.pid}-{self._token}-{self.files_written:05d}.parquet"
        with atomic_output(self.directory / name, what="step table") as fh:
            pq.write_table(table, fh, compression="zstd")
        self.files_written += 1
