"""The step tables' background thread: takes the steps' rows from the profile's step ring,
samples the RSS, and writes each full row group as one Parquet file, so the training loop's
``step()`` pays nothing for the tables beyond the ring's own stores."""

from __future__ import annotations

import functools
import os
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.atomic import atomic_output
from stepscope.extras import require
from stepscope.failures import failure_log
from stepscope.rss import rss_bytes
from stepscope.steptables.schema import INT_COLUMNS, SCHEMA_VERSION, arrow_schema
from stepscope.trace.model import Trace

if TYPE_CHECKING:  # the analysis is imported only when a window's rows are written
    from stepscope.steptables.breakdown import StepBreakdown

__all__ = ["RAW_COLUMNS", "Rows", "TableWriter", "WindowRows"]

RSS_PERIOD_S = 0.02
"""How often the writer thread samples the RSS the rows carry."""
MAX_PENDING = 4
"""Row groups waiting to be written before new rows are dropped (and counted)."""
_failures = failure_log("step_tables")


RAW_COLUMNS = ("step", "start_ns", "end_ns", "data_wait_ns", "optimizer_ns", "gc_ns",
               "collective_ns", "cpu_ns", "rss_bytes")  # fmt: skip
"""A ``Rows`` block's int64 columns: the step ring's, before ``start_unix_ns``, ``duration_ns``
and ``busy_ns`` are worked out from the monotonic start and end at write time."""


@dataclass
class Rows:
    """Rows of steps in order, columnar (``RAW_COLUMNS``); ``recorded``: a trace window's."""

    columns: list[array[int]] = field(default_factory=lambda: [array("q") for _ in RAW_COLUMNS])
    recorded: bool = False

    def __len__(self) -> int:
        return len(self.columns[0])

    def extend(self, other: Rows, lo: int = 0, hi: int | None = None) -> None:
        """Append ``other``'s rows ``lo:hi``."""
        for mine, theirs in zip(self.columns, other.columns, strict=True):
            mine.extend(theirs[lo:hi])

    def split(self, n: int) -> Rows:
        """Remove the first ``n`` rows and return them."""
        head = Rows([column[:n] for column in self.columns], self.recorded)
        for column in self.columns:
            del column[:n]
        return head

    def before_step(self, step: int) -> None:
        """Drop the rows of ``step`` and later (rows are in step order)."""
        steps = self.columns[0]
        keep = len(steps)
        while keep and steps[keep - 1] >= step:
            keep -= 1
        for column in self.columns:
            del column[keep:]


@dataclass
class WindowRows:
    """The recorded rows of one trace window and its trace (None: no trace was built)."""

    rows: Rows
    trace: Trace | None


class TableWriter:
    """Writes the rows handed over by ``submit`` into ``directory`` on its own thread, which
    also calls ``poll`` (the recorder taking new rows from the step ring) every ``RSS_PERIOD_S``."""

    def __init__(self, directory: Path, host: str, base_ns: int, poll: Callable[[], None]) -> None:
        self.directory = directory
        self.host = host
        self.base_ns = base_ns
        """Added to a monotonic ns reading to make it Unix ns."""
        self.pid = os.getpid()
        self.rss = rss_bytes() or 0
        """The latest RSS sample (what the rows taken at that moment carry)."""
        self.files_written = 0
        self.written: list[Path] = []
        """The files this writer has left (one once compacted at close)."""
        self._poll = poll
        self._token = time.time_ns()  # two profiles of one process never write the same name
        self.dropped_rows = 0
        """Rows lost because the writer fell ``MAX_PENDING`` row groups behind."""
        self._queue: deque[Rows | WindowRows] = deque()
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(
            target=self._loop, name="stepscope-step-tables", daemon=True
        )
        self._thread.start()

    def submit(self, rows: Rows, trace: Trace | None = None) -> None:
        """Queue rows for writing (recorded ones with their window's trace, for the breakdown);
        past ``MAX_PENDING`` blocks waiting, the rows are dropped and counted."""
        if len(self._queue) >= MAX_PENDING:
            self.dropped_rows += len(rows)
            return
        self._queue.append(WindowRows(rows, trace) if rows.recorded else rows)
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
            self.rss = rss_bytes() or 0
            closing = self._closing  # read before the last poll: nothing is left behind
            self._guarded(self._poll, "step tables ring", "its rows are taken at the next try")
            while self._queue:
                item = self._queue.popleft()
                window = item if isinstance(item, WindowRows) else WindowRows(item, None)
                self._guarded(
                    functools.partial(self._write_window, window),
                    "step tables writer",
                    f"{len(window.rows)} step rows lost; later row groups are still tried",
                )
            if closing:
                self._guarded(self._compact, "step tables compaction", "the parts stay as they are")
                return

    def _guarded(self, work: Callable[[], None], where: str, then: str) -> None:
        try:
            work()
        except Exception as exc:
            _failures.report(
                type(exc).__name__,
                where,
                exc,
                strict=False,  # on this thread nobody could catch it
                then=then,
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

    def _write_window(self, window: WindowRows) -> None:
        self._write(window.rows, self._breakdown(window.trace))

    def _write(self, rows: Rows, breakdown: dict[int, StepBreakdown]) -> None:
        pa = require("pyarrow", "step tables", "parquet")
        pc = require("pyarrow.compute", "step tables", "parquet")
        pq = require("pyarrow.parquet", "step tables", "parquet")

        n = len(rows)
        if n == 0:
            return
        raw = {
            name: pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(column)])
            for name, column in zip(RAW_COLUMNS, rows.columns, strict=True)
        }
        raw["start_unix_ns"] = pc.add(raw["start_ns"], self.base_ns)
        raw["duration_ns"] = pc.subtract(raw["end_ns"], raw["start_ns"])
        columns = [raw[name] for name, _ in INT_COLUMNS]
        columns += [
            pa.repeat(pa.scalar(rows.recorded), n),
            pa.repeat(pa.scalar(self.host, pa.string()), n),
            pa.repeat(pa.scalar(self.pid, pa.int32()), n),
            pa.repeat(pa.scalar(SCHEMA_VERSION, pa.int16()), n),
        ]
        steps = rows.columns[0]
        found = [breakdown.get(step) for step in steps] if breakdown else None
        for part in ("computation_ns", "communication_ns", "idle_ns"):
            if found is None:
                columns.append(pa.nulls(n, pa.int64()))
            else:
                values = [getattr(b, part) if b is not None else None for b in found]
                columns.append(pa.array(values, type=pa.int64()))
        categories_type = pa.map_(pa.string(), pa.int64())
        if found is None:
            columns.append(pa.nulls(n, categories_type))
        else:
            categories = [list(b.categories.items()) if b is not None else None for b in found]
            columns.append(pa.array(categories, type=categories_type))
        busy = pc.max_element_wise(pc.subtract(raw["duration_ns"], raw["collective_ns"]), 0)
        columns += [raw["collective_ns"], busy]
        table = pa.Table.from_arrays(columns, schema=arrow_schema())
        name = f"steps-{steps[0]:010d}-{self.pid}-{self._token}-{self.files_written:05d}.parquet"
        with atomic_output(self.directory / name, what="step table") as fh:
            pq.write_table(table, fh, compression="zstd")
        self.files_written += 1
        self.written.append(self.directory / name)

    def _compact(self) -> None:
        """Merge this writer's files into one, in step order (a query reads one file per rank
        instead of many); a rank killed before its close keeps its parts, as readable."""
        parts = self.written
        if len(parts) < 2:
            return
        pa = require("pyarrow", "step tables", "parquet")
        pq = require("pyarrow.parquet", "step tables", "parquet")
        table = pa.concat_tables([pq.read_table(part) for part in parts]).sort_by("step")
        first = table.column("step")[0].as_py()
        target = self.directory / f"steps-{first:010d}-{self.pid}-{self._token}-all.parquet"
        with atomic_output(target, what="step table") as fh:
            pq.write_table(table, fh, compression="zstd")
        for part in parts:  # a query in these few ms may see the rank's rows twice
            part.unlink(missing_ok=True)
        self.written = [target]
