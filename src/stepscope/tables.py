"""Registered CSV metric tables, written only when enabled by configuration.

A table is registered once with its column names; code anywhere calls
``get_metric_table(name).add_row(lambda: {...})``.  While the table is disabled ``add_row`` returns
after one attribute test and never calls the row function.  Enabled tables append to
``metric_table_<name>.csv`` in ``config.tables_dir``: a ``model_name,<columns...>`` header once,
then one line per row whose first cell is ``config.run_name``; floats are written as ``%.6f`` and
``None`` as an empty cell.

Tables are enabled by ``config.metric_tables`` (comma-separated names; its default comes from
``STEPSCOPE_METRIC_TABLES``).  Naming an unregistered table is a ``ValueError`` that lists the
registered ones: at once when set from code, at first use when it came from the environment
(tables of the program itself may be registered after stepscope is imported).

Several threads and processes may append to one table: each process keeps one append-only handle
and writes each complete line under a file lock (``O_APPEND``), and the header is decided under the
same lock, so lines never interleave and the header appears once.  A row that fails part-way (a
full disk) is cut back, and a row torn by a kill is removed at the next open: the file always ends
on a whole row.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from stepscope import forks
from stepscope.appendlog import append_whole, repair_tail
from stepscope.atomic import atomic_output
from stepscope.config import config
from stepscope.failures import failure_log
from stepscope.text import clean_text

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "REGISTERED_METRIC_TABLES",
    "MetricTable",
    "enabled_metric_tables",
    "format_cell",
    "format_csv_row",
    "get_metric_table",
    "is_metric_table_enabled",
    "purge_old_log_files",
]

_failures = failure_log("tables")

Cell = str | int | float | None

_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def format_cell(value: object, where: str = "a metric table cell") -> str:
    """A cell's text: floats as ``%.6f``, None as empty, str and int as they print."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}"
    if isinstance(value, (str, int)):  # bool is an int and prints as True/False
        return str(value)
    raise TypeError(
        f"{where}: cells must be str, int, float or None, got {type(value).__name__}: "
        f"{value!r} (convert it to str first)"
    )


def format_csv_row(cells: Sequence[str]) -> bytes:
    """One CSV line (minimal quoting, ``\\n`` terminator), UTF-8 encoded.

    A cell holding ``\\r`` or ``\\n`` is quoted (so it never splits a row); unpaired surrogates
    become U+FFFD.
    """
    buf = io.StringIO()
    # "\r\n" makes the writer quote cells holding either character; the row then ends in "\n"
    csv.writer(buf, lineterminator="\r\n").writerow(cells)
    return clean_text(buf.getvalue()[:-2] + "\n").encode()


class _AppendFile:
    """One process's append-only handle on a table file; reopens if the file is replaced."""

    def __init__(self, path: Path, header: bytes) -> None:
        self.path = path
        self.header = header
        self.fd = -1
        self.ident: tuple[int, int] = (0, 0)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            with _locked(fd):
                repair_tail(fd)  # a row torn by a process killed mid-write
                st = os.fstat(fd)
                if st.st_size == 0:
                    append_whole(fd, self.header)
                else:
                    self._check_header()
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)

    def _check_header(self) -> None:
        with open(self.path, "rb") as f:
            found = f.readline()
        if found != self.header:
            raise ValueError(
                f"{self.path} exists with header {found.decode(errors='replace').rstrip()!r}, "
                f"not {self.header.decode().rstrip()!r}; move it away or call "
                "stepscope.tables.purge_old_log_files()"
            )

    def append(self, line: bytes) -> None:
        if self.fd >= 0:
            try:
                st = os.stat(self.path)
                current = (st.st_dev, st.st_ino) == self.ident
            except FileNotFoundError:
                current = False
            if not current:  # deleted or replaced (e.g. purged by another process)
                self.close()
        if self.fd < 0:
            self._open()
        with _locked(self.fd):  # a failed row is cut back, which must not cut another's
            append_whole(self.fd, line)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``fd`` (other processes append to the same file)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)


class MetricTable:
    """A registered table: a name, its columns, and the CSV file it appends to when enabled."""

    def __init__(self, table_name: str, column_names: Sequence[str]) -> None:
        if not isinstance(table_name, str) or not _TABLE_NAME.fullmatch(table_name):
            raise ValueError(
                f"metric table names are letters, digits, '_', '.', '-' (no leading '.' or '-'), "
                f"got {table_name!r}"
            )
        if isinstance(column_names, str) or not isinstance(column_names, Sequence):
            raise TypeError(
                f"metric table {table_name!r}: column_names must be a list of str, "
                f"got {type(column_names).__name__}"
            )
        columns = list(column_names)
        bad = [c for c in columns if not isinstance(c, str) or not c]
        if not columns or bad:
            raise ValueError(
                f"metric table {table_name!r} needs one or more non-empty str column names, "
                f"got {column_names!r}"
            )
        dupes = sorted({c for c in columns if columns.count(c) > 1 or c == "model_name"})
        if dupes:
            raise ValueError(
                f"metric table {table_name!r}: duplicate column names {dupes} "
                "('model_name' is the first column of every table)"
            )
        self.table_name = table_name
        self.column_names = columns
        self.num_rows_added = 0
        self.num_write_errors = 0
        """Rows lost to I/O errors (also ``failure_counts()["tables"]``; logged once per table;
        ``config.strict`` re-raises)."""
        self._column_set = frozenset(columns)
        self._lock = threading.Lock()
        self._file: _AppendFile | None = None
        # ``_gate`` is what add_row tests: True when the table is enabled, or when the enabled
        # names still await validation (the slow path resolves them, then fixes every gate).
        self._gate = False
        self._enabled = False

    def __repr__(self) -> str:
        state = "enabled" if self._enabled else "disabled"
        return f"MetricTable({self.table_name!r}, {self.column_names!r}, {state})"

    @staticmethod
    def register_table(name: str, column_names: Sequence[str]) -> MetricTable:
        """Register (or return the identical existing) table ``name`` with these columns."""
        return _registry.register(name, column_names)

    # -- writing -----------------------------------------------------------------------------
    def add_row(self, row_fn: Callable[[], Mapping[str, Cell]]) -> None:
        """Append the row ``row_fn()`` returns, calling it only when the table is enabled."""
        if not self._gate:
            return
        self._add_row(row_fn)

    def _add_row(self, row_fn: Callable[[], Mapping[str, Cell]]) -> None:
        _registry.resolve()
        if not self._enabled:
            return
        row = row_fn()
        if not isinstance(row, Mapping):
            raise TypeError(
                f"metric table {self.table_name!r}: row_fn must return a dict of column -> value, "
                f"got {type(row).__name__}"
            )
        if row.keys() != self._column_set:
            missing = [c for c in self.column_names if c not in row]
            extra = [k for k in row if k not in self._column_set]
            raise ValueError(
                f"row for metric table {self.table_name!r} does not match its columns: "
                f"missing {missing}, extra {extra}; the columns are {self.column_names}"
            )
        run = config.run_name
        cells = [run or ""]
        name = self.table_name
        cells.extend(
            format_cell(row[c], f"metric table {name!r}, column {c!r}") for c in self.column_names
        )
        self._write(format_csv_row(cells))

    def _write(self, line: bytes) -> None:
        with self._lock:
            try:
                if self._file is None:
                    self._file = _AppendFile(self.output_path(), self._header())
                self._file.append(line)
                self.num_rows_added += 1
            except OSError as exc:
                self.num_write_errors += 1
                _failures.report(
                    "write_error",
                    f"metric table {self.table_name!r}",
                    exc,
                    message=(
                        f"cannot write metric table {self.table_name!r} to {self.output_path()}"
                    ),
                    then="its rows are dropped (counted in MetricTable.num_write_errors)",
                    once=(id(self), "write"),
                )

    def _header(self) -> bytes:
        return format_csv_row(["model_name", *self.column_names])

    def output_filename(self) -> str:
        """The file name: ``metric_table_<name>.csv``."""
        return f"metric_table_{self.table_name}.csv"

    def output_path(self) -> Path:
        """Where the table is written: ``config.tables_dir / output_filename()``."""
        return Path(config.tables_dir) / self.output_filename()

    def write_header(self) -> None:
        """Replace the table file with one holding just the header (atomically)."""
        with self._lock:
            self._close_locked()
            path = self.output_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_output(path, what="metric table") as f:
                f.write(self._header())

    def close(self) -> None:
        """Close this process's handle on the file (the next row reopens it)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Registry:
    """The registered tables and which of them configuration enables."""

    def __init__(self) -> None:
        self.tables: dict[str, MetricTable] = {}
        self.lock = threading.RLock()
        self.wanted: frozenset[str] = frozenset()
        self.pending = False  # wanted names not yet checked against the registered tables

    def register(self, name: str, column_names: Sequence[str]) -> MetricTable:
        table = MetricTable(name, column_names)
        with self.lock:
            existing = self.tables.get(name)
            if existing is not None:
                if existing.column_names != table.column_names:
                    raise ValueError(
                        f"metric table {name!r} is already registered with columns "
                        f"{existing.column_names}, not {table.column_names}"
                    )
                return existing
            self.tables[name] = table
            if self.pending and self.wanted <= self.tables.keys():
                self.pending = False
            self._set_gates()
        return table

    def _set_gates(self) -> None:
        for name, table in self.tables.items():
            table._enabled = not self.pending and name in self.wanted
            table._gate = self.pending or table._enabled

    def _unknown_error(self, unknown: Iterable[str], source: str) -> ValueError:
        return ValueError(
            f"{source} names metric tables that are not registered: {sorted(unknown)}; "
            f"registered tables: {sorted(self.tables)} (register a table with "
            "MetricTable.register_table before enabling it)"
        )

    def configure(self, spec: str, *, validate: bool) -> None:
        """Enable the tables named in the comma-separated ``spec``."""
        wanted = frozenset(part.strip() for part in spec.split(",") if part.strip())
        with self.lock:
            unknown = wanted - self.tables.keys()
            if unknown and validate:
                raise self._unknown_error(unknown, f"config.metric_tables={spec!r}")
            self.wanted = wanted
            self.pending = bool(unknown)
            self._set_gates()

    def resolve(self) -> None:
        """Check names taken from the environment now that the program registered its tables."""
        if not self.pending:
            return
        with self.lock:
            unknown = self.wanted - self.tables.keys()
            if unknown:
                raise self._unknown_error(
                    unknown, f"metric tables {config.metric_tables!r} (from configuration)"
                )
            self.pending = False
            self._set_gates()

    def enabled(self) -> frozenset[str]:
        self.resolve()
        return self.wanted

    def close_all(self) -> None:
        with self.lock:
            for table in self.tables.values():
                table.close()


_registry = _Registry()


def _reinit_locks_after_fork() -> None:
    # A lock held by another thread at fork time would stay locked forever in the child.
    _registry.lock = threading.RLock()
    for table in _registry.tables.values():
        table._lock = threading.Lock()


forks.after_fork_in_child(_reinit_locks_after_fork)

REGISTERED_METRIC_TABLES: Mapping[str, MetricTable] = _registry.tables
"""Every registered table by name (read-only view; register with ``register_table``)."""


def _on_config_change(field_name: str) -> None:
    if field_name == "metric_tables":
        _registry.configure(config.metric_tables, validate=True)
    elif field_name == "tables_dir":
        _registry.close_all()


def enabled_metric_tables() -> frozenset[str]:
    """Names of the enabled tables."""
    return _registry.enabled()


def is_metric_table_enabled(name: str) -> bool:
    """Whether table ``name`` is enabled."""
    return name in _registry.enabled()


def get_metric_table(name: str) -> MetricTable:
    """The registered table ``name``; a ``ValueError`` lists the registered ones otherwise."""
    table = _registry.tables.get(name)
    if table is None:
        raise ValueError(
            f"metric table {name!r} is not registered; registered tables: "
            f"{sorted(_registry.tables)}"
        )
    return table


def purge_old_log_files() -> None:
    """Start every enabled table's file afresh with just its header.

    Call it once in the parent process before workers start appending (a worker that already
    holds the old file reopens the new one at its next row).
    """
    for name in sorted(_registry.enabled()):
        _registry.tables[name].write_header()


def _register_builtin_tables() -> None:
    builtin: dict[str, list[str]] = {
        "slow_fusion": [
            "kernel1_path",
            "kernel1_latency",
            "kernel2_path",
            "kernel2_latency",
            "fused_kernel_path",
            "fused_kernel_latency",
            "slow_down_ratio",
        ],
        "graph_stats": ["graph_id", "num_nodes_before_fusion", "num_nodes_after_fusion"],
        "persistent_red_perf": [
            "kernel1_name",
            "kernel2_name",
            "kernel1_latency",
            "kernel2_latency",
            "size_hints",
            "reduction_hint",
            "speedup",
        ],
        "fusion_failure_due_to_indexing_mismatch": [
            "pre_grad_graph_id",
            "post_grad_graph_id",
            "node1_name",
            "node2_name",
            "node1_debug_str",
            "node2_debug_str",
            "common_buffer_names",
            "failure_reason",
        ],
        # One row per generated Triton kernel; see stepscope.kernels.
        "kernel_metadata": [
            "kernel_name",
            "kernel_path",
            "kernel_category",
            "size_hints",
            "reduction_hint",
            "line_of_code",
            "num_load",
            "num_store",
            "num_for_loop",
            "num_atomic_add",
            "num_args",
            "xnumel",
            "ynumel",
            "rnumel",
            "kernel_args_num_gb",
        ],
    }
    for name, columns in builtin.items():
        MetricTable.register_table(name, columns)


_register_builtin_tables()
_registry.configure(config.metric_tables, validate=False)
config.on_change(_on_config_change)
