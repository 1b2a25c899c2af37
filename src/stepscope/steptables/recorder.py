"""The step tables' recorder: one row per step, stored in a preallocated buffer by ``step()``.

Phase times come from hooks that only add to counters: the DataLoader iterator's ``__next__``
(wrapped on its class), torch's global optimizer step hooks and ``gc.callbacks``.  Full row
groups go to the writer thread (``writer.py``); a killed rank loses at most the open one.
"""

from __future__ import annotations

import functools
import gc
import os
import socket
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope import clock
from stepscope.atomic import make_directory
from stepscope.collectors import import_watch
from stepscope.collectors.base import Collector
from stepscope.config import config
from stepscope.distributed import rank_and_world_size
from stepscope.extras import require
from stepscope.steptables.schema import partition_value
from stepscope.steptables.writer import NCOLS, RowGroup, TableWriter
from stepscope.trace.model import Trace

__all__ = ["DEFAULT_ROWS_PER_FILE", "NoStepTables", "StepTables", "default_run", "step_tables_of"]

DEFAULT_ROWS_PER_FILE = 1024
"""Steps per row group (and file): what a killed rank can lose at most."""
_thread_time_ns = time.thread_time_ns


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

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rows_per_file: int = DEFAULT_ROWS_PER_FILE,
        run: str | None = None,
        strict: bool | None = None,
    ) -> None:
        if isinstance(rows_per_file, bool) or not isinstance(rows_per_file, int):
            raise TypeError(f"rows_per_file must be an int, got {rows_per_file!r}")
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be 1 or more, got {rows_per_file}")
        require("pyarrow", "step tables (profile(step_tables=...))", "parquet")
        self.directory = Path(os.fspath(directory))
        self.rows_per_file = rows_per_file
        self.run = run
        self.strict = strict
        self.path: Path | None = None
        """The rank's partition directory, once started."""
        self._writer: TableWriter | None = None
        self._group: RowGroup | None = None
        self._base = clock.wall_base_ns()
        self._start_ns = 0
        self._cpu_ns = 0
        self._data_ns = self._data_start = 0
        self._opt_ns = self._opt_start = self._opt_depth = 0
        self._gc_ns = self._gc_start = 0
        self._undo: list[Callable[[], None]] = []
        self._active = False
        self._held: list[tuple[int, ...]] = []
        """Rows of recorded steps, until their window's trace is built."""

    @property
    def dropped_rows(self) -> int:
        """Rows lost because the writer thread fell behind (0 normally)."""
        return self._writer.dropped_rows if self._writer is not None else 0

    def begin(self) -> None:
        """Open the rank's directory, start the writer thread and the hooks; a step begins."""
        if self._active:
            return
        rank = rank_and_world_size()[0] or 0
        run = partition_value(self.run or default_run())
        self.path = make_directory(
            self.directory / f"run={run}" / f"rank={rank}", "step tables", "step tables directory"
        )
        self._writer = TableWriter(self.path, socket.gethostname(), self.rows_per_file)
        self._group = self._writer.fresh()
        self._active = True
        gc.callbacks.append(self._on_gc)
        self._undo.append(lambda: gc.callbacks.remove(self._on_gc))
        import_watch.when_imported("torch.utils.data", self._hook_dataloader)
        import_watch.when_imported("torch.optim", self._hook_optimizer)
        self._start_ns = clock.now_ns()
        self._cpu_ns = _thread_time_ns()

    def step_ended(self, step: int, recorded: bool) -> None:
        """Store the row of ``step``, which ends now (the profiler's ``step()`` calls this)."""
        now = clock.now_ns()
        cpu = _thread_time_ns()
        if self._opt_start:  # a boundary inside a phase splits it between the two steps
            self._opt_ns += now - self._opt_start
            self._opt_start = now
        if self._data_start:
            self._data_ns += now - self._data_start
            self._data_start = now
        group = self._group
        writer = self._writer
        if writer is None or not self._active:
            return
        if recorded:  # written with its window's breakdown (window_built)
            row = (step, self._start_ns + self._base, now - self._start_ns, self._data_ns,
                   self._opt_ns, self._gc_ns, cpu - self._cpu_ns, writer.rss)  # fmt: skip
            self._held.append(row)
            if len(self._held) >= self.rows_per_file:  # a window that never ends: bounded
                self._hand_over_held(None)
        else:
            if group is None:
                group = self._group = writer.fresh()
            if group is None:
                writer.dropped_rows += 1
            else:
                ints, row_index = group.ints, group.rows
                i = row_index * NCOLS
                ints[i] = step
                ints[i + 1] = self._start_ns + self._base
                ints[i + 2] = now - self._start_ns
                ints[i + 3] = self._data_ns
                ints[i + 4] = self._opt_ns
                ints[i + 5] = self._gc_ns
                ints[i + 6] = cpu - self._cpu_ns
                ints[i + 7] = writer.rss
                group.rows = row_index + 1
                if row_index + 1 == group.capacity:
                    writer.submit(group)
                    self._group = writer.fresh()
        self._data_ns = self._opt_ns = self._gc_ns = 0
        self._start_ns = now
        self._cpu_ns = cpu

    def close(self) -> None:
        """Hand the open row group to the writer, remove the hooks, wait for the files."""
        if not self._active:
            return
        self._active = False
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        import_watch.cancel("torch.utils.data", self._hook_dataloader)
        import_watch.cancel("torch.optim", self._hook_optimizer)
        writer, group = self._writer, self._group
        if writer is not None:
            self._hand_over_held(None)  # recorded steps whose window was never built
            if group is not None and group.rows:
                writer.submit(group)
            self._group = None
            writer.close()

    def collectors(self) -> list[Collector]:
        """What the profile adds to its collectors: this, for ``window_built``."""
        return [self]

    def window_built(self, trace: Trace) -> None:
        """Hand the held rows of the window's steps to the writer with the window's trace."""
        self._hand_over_held(trace)

    def _hand_over_held(self, trace: Trace | None) -> None:
        held, writer = self._held, self._writer
        if not held or writer is None:
            return
        group = RowGroup(len(held))
        for n, row in enumerate(held):
            group.ints[n * NCOLS : (n + 1) * NCOLS] = array("q", row)
            group.recorded[n] = 1
        group.rows = len(held)
        self._held = []
        writer.submit_window(group, trace)

    # -- hooks: each only adds to a counter -----------------------------------------------------
    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = clock.now_ns()
        elif self._gc_start:
            self._gc_ns += clock.now_ns() - self._gc_start
            self._gc_start = 0

    def _hook_optimizer(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        # a subclass's step() calling super().step() runs both hooks twice, nested: only the
        # outermost pair counts
        def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self._active:
                if not self._opt_depth:
                    self._opt_start = clock.now_ns()
                self._opt_depth += 1

        def post(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self._opt_depth:
                self._opt_depth -= 1
                if not self._opt_depth and self._opt_start:
                    self._opt_ns += clock.now_ns() - self._opt_start
                    self._opt_start = 0

        handles = (register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post))

        def remove() -> None:
            # inside an optimizer step torch is iterating these hooks: leave them, inert
            if not self._opt_depth:
                for handle in handles:
                    handle.remove()

        self._undo.append(remove)

    def _hook_dataloader(self) -> None:
        from torch.utils.data import dataloader

        cls: Any = dataloader._BaseDataLoaderIter
        original = cls.__dict__["__next__"]

        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:
            if not self._active or self._data_start:  # closed, or nested in another __next__
                return original(iterator)
            self._data_start = clock.now_ns()
            try:
                return original(iterator)
            finally:
                if self._data_start:
                    self._data_ns += clock.now_ns() - self._data_start
                    self._data_start = 0

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

    def begin(self) -> None:
        """Nothing to open."""

    def step_ended(self, step: int, recorded: bool) -> None:
        """Nothing to store."""

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
