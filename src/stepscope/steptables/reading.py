"""Reading a directory of step tables on DuckDB: which files are step tables of which run and
rank, which are damaged or copies, and one view (``steps``) that reads every row once.

``stepscope fleet`` (``fleet.py``) runs its analysis over the connection ``connect`` gives;
``--sql`` runs a query of the user's own over the same view.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stepscope.extras import require
from stepscope.steptables.schema import ADDED_IN_2, COLUMNS

__all__ = [
    "MAX_RANK",
    "FleetTables",
    "Part",
    "connect",
    "leave_out_damaged",
    "list_parts",
    "rank_number",
    "retrying",
    "run_sql",
]

T = TypeVar("T")

MAX_RANK = 2**63 - 1
"""The largest rank number (a ``rank=`` directory beyond it is not a rank)."""
_GLOB = frozenset("*?[")
"""Characters DuckDB reads as a glob in a file path; each is written as ``[c]`` instead."""


@dataclass(frozen=True)
class Part:
    """One step table file: where it is, and the run and rank its directories name."""

    path: str
    """Its absolute path."""
    shown: str
    """Its path below the directory given (what notes name)."""
    run: str
    rank: int


@dataclass
class FleetTables:
    """A DuckDB connection whose view ``steps`` reads every readable step table under
    ``path``, each row once, and what was left out (``notes``)."""

    con: Any
    path: Path
    parts: list[Part]
    """The files read, in path order."""
    union_by_name: bool
    """Whether the files' columns differ (read by name, which costs a schema read per file)."""
    repeated: frozenset[str] = frozenset()
    """Files that share rows with another (a copied part, a kill during compaction): read
    without the rows already read from another file (``dropped``)."""
    notes: list[str] = field(default_factory=list)
    """What was skipped or counted once, in words."""
    held: Any = None
    """The private directory the parts are read through (removed with this object)."""
    absent: tuple[str, ...] = ()
    """Columns no file has (version-1 tables only): the view reads them as null."""

    @property
    def rank_files(self) -> dict[int, list[str]]:
        """Each rank's files."""
        found: dict[int, list[str]] = {}
        for part in self.parts:
            found.setdefault(part.rank, []).append(part.path)
        return found

    def source(self, ranks: Iterable[int] | None = None) -> str:
        """SQL for the rows of ``ranks`` (every rank: the ``steps`` view), each row once."""
        if ranks is None:
            return "steps"
        wanted = set(ranks)
        parts = [p for p in self.parts if p.rank in wanted]
        if not parts:
            return "(SELECT * FROM steps WHERE false)"
        rows = _select(parts, self)
        if not self.absent:
            return rows
        nulls = "".join(f", NULL::BIGINT AS {name}" for name in self.absent)
        return f"(SELECT *{nulls} FROM {rows})"


def _select(parts: list[Part], tables: FleetTables) -> str:
    """SQL for the rows of ``parts``, the rows ``dropped`` left out of the repeated ones."""
    if not parts:
        return "(SELECT * FROM steps WHERE false)"
    plain = [p for p in parts if p.path not in tables.repeated]
    repeated = [p for p in parts if p.path in tables.repeated]
    selects = []
    if plain:
        selects.append(f"SELECT * FROM {_read(plain, tables.union_by_name)}")
    if repeated:
        selects.append(
            "SELECT * EXCLUDE (filename, file_row_number) FROM "
            f"{_read(repeated, tables.union_by_name, numbered=True)} "
            "ANTI JOIN dropped USING (filename, file_row_number)"
        )
    return "(" + " UNION ALL BY NAME ".join(selects) + ")"


def _read(parts: list[Part], union_by_name: bool, numbered: bool = False) -> str:
    """``read_parquet`` of exactly these files (never a glob), with ``run`` and ``rank``."""
    listed = "[" + ", ".join(_quoted(_literal_path(p.path)) for p in parts) + "]"
    options = "hive_partitioning = true, hive_types = {'run': VARCHAR, 'rank': BIGINT}"
    options += f", union_by_name = {'true' if union_by_name else 'false'}"
    if numbered:
        options += ", filename = true, file_row_number = true"
    return f"read_parquet({listed}, {options})"


def _literal_path(path: str) -> str:
    """``path`` as DuckDB reads it literally: each glob character in brackets."""
    return "".join(f"[{c}]" if c in _GLOB else c for c in path)


def _readable_by_duckdb(path: str) -> bool:
    """Whether DuckDB can name ``path`` at all: with a glob character, a backslash is taken
    as an escape and cannot be escaped itself."""
    return "\\" not in path or not any(c in _GLOB for c in path)


def rank_number(label: str) -> int | None:
    """The rank a ``rank=`` directory names: ASCII decimal digits up to ``MAX_RANK``, else
    None (``abc``, ``..``, ``1e3``, ``٣``, ``²``, ``-1`` are no ranks)."""
    if not label or not label.isascii() or not label.isdigit() or len(label) > 19:
        return None
    number = int(label)
    return number if number <= MAX_RANK else None


def list_parts(root: Path) -> tuple[list[Part], list[str]]:
    """The ``*.parquet`` files under ``root`` with their run and rank (the first ``run=`` and
    ``rank=`` directories of the path from ``root``'s own), and notes on the files left out:
    not under ``run=NAME/rank=N``, a rank that is no number, a path DuckDB cannot name.  A
    part's ``path`` is its path below ``root`` until ``connect`` places it.  Directory links
    are not followed (a loop ends nothing)."""
    inherited = [p for p in root.parts if p.startswith(("run=", "rank="))]
    parts: list[Part] = []
    not_rank: dict[str, int] = {}
    outside: list[str] = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            if not name.endswith(".parquet"):
                continue
            shown = os.path.relpath(os.path.join(folder, name), root)
            labels = inherited + [p for p in Path(shown).parts[:-1]]
            runs = [p[4:] for p in labels if p.startswith("run=")]
            ranks = [p[5:] for p in labels if p.startswith("rank=")]
            if not runs or not ranks:
                outside.append(shown)
                continue
            rank = rank_number(ranks[0])
            if rank is None:
                label = f"rank={ranks[0]}"
                not_rank[label] = not_rank.get(label, 0) + 1
                continue
            parts.append(Part(shown, shown, runs[0], rank))
    notes = []
    if not_rank:
        named = ", ".join(f"{label!r} ({n} files)" for label, n in sorted(not_rank.items()))
        notes.append(f"skipped directories whose rank is not a number (0-{MAX_RANK}): {named}")
    if outside:
        notes.append(f"skipped {len(outside)} files not under run=NAME/rank=N: {_some(outside)}")
    return parts, notes


def _some(names: list[str], most: int = 5) -> str:
    """The first ``most`` names, and how many more."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


_SHAPES = """
SELECT file_name, list(name || ' ' || coalesce(type, '') ORDER BY name) AS shape
FROM parquet_schema({files}) GROUP BY file_name
"""
"""One schema read of each file: its columns, to read them by position when all agree."""

_SPANS = """
SELECT file_name,
       min(stats_min_value) FILTER (WHERE path_in_schema = 'host'),
       max(stats_max_value) FILTER (WHERE path_in_schema = 'host'),
       min(TRY_CAST(stats_min_value AS BIGINT)) FILTER (WHERE path_in_schema = 'pid'),
       max(TRY_CAST(stats_max_value AS BIGINT)) FILTER (WHERE path_in_schema = 'pid'),
       min(TRY_CAST(stats_min_value AS BIGINT)) FILTER (WHERE path_in_schema = 'step'),
       max(TRY_CAST(stats_max_value AS BIGINT)) FILTER (WHERE path_in_schema = 'step')
FROM parquet_metadata({files}) GROUP BY file_name
"""
"""Each file's hosts, pids and steps from its statistics (the footer read ``_SHAPES`` made)."""

_DROPPED = """
CREATE TEMP TABLE dropped AS
SELECT filename, file_row_number FROM (
    SELECT filename, file_row_number, row_number() OVER (
        PARTITION BY host, pid, step, start_unix_ns ORDER BY rank, run, filename, file_row_number
    ) AS copy
    FROM {source}
) WHERE copy > 1
"""
"""Rows already read from another file: the same step of the same process (the first file,
by rank and name, keeps it)."""


def _files_sql(parts: list[Part]) -> str:
    return "[" + ", ".join(_quoted(_literal_path(p.path)) for p in parts) + "]"


def _damaged(con: Any, duckdb: Any, parts: list[Part], full: bool) -> dict[str, str]:
    """The parts DuckDB cannot read, with the first line of why: their footers, or
    (``full``) every value of every column."""
    bad: dict[str, str] = {}
    for part in parts:
        one = _files_sql([part])
        try:
            if full:  # a hash of every value (a count of a non-null column reads none)
                con.execute(f"SELECT max(hash(COLUMNS(*))) FROM read_parquet({one})").fetchall()
            else:
                con.execute(f"SELECT count(*) FROM parquet_schema({one})").fetchall()
        except duckdb.Error as exc:
            bad[part.path] = _first_line(exc).replace(part.path, part.shown)
    return bad


def _damaged_note(parts: list[Part], bad: dict[str, str]) -> str:
    named = [p.shown for p in parts if p.path in bad]
    why = next(iter(bad.values()))
    return f"skipped {len(named)} damaged files: {_some(named)} (the first: {why})"


def _place(root: Path, parts: list[Part], notes: list[str]) -> tuple[Any, list[Part]]:
    """A private directory with one link to ``root`` under ``root``'s own ``run=``/``rank=``
    names, and ``parts`` with their paths through it.  DuckDB then sees no name from above the
    directory given: no glob character, backslash or ``key=value`` of its parents (the first
    ``rank=`` of a path is the one DuckDB takes).  Parts DuckDB cannot name are left out."""
    held = tempfile.TemporaryDirectory(prefix="stepscope-fleet-")
    base = Path(held.name, *[p for p in root.parts if p.startswith(("run=", "rank="))])
    base.mkdir(parents=True, exist_ok=True)
    link = base / "d"
    link.symlink_to(root.resolve(), target_is_directory=True)
    placed: list[Part] = []
    unnamable: list[str] = []
    for part in parts:
        path = str(link / part.shown)
        if _readable_by_duckdb(path):
            placed.append(Part(path, part.shown, part.run, part.rank))
        else:
            unnamable.append(part.shown)
    if unnamable:
        notes.append(
            f"skipped {len(unnamable)} files whose path holds both a backslash and one of "
            f"* ? [ (DuckDB cannot read such a path): {_some(unnamable)}"
        )
    return held, placed


def connect(path: str | os.PathLike[str]) -> FleetTables:
    """The step tables under ``path`` on a DuckDB connection (the view ``steps``).

    Only files under ``run=NAME/rank=N`` (N in ASCII decimal digits) are read, each by its
    own name (a directory name is never a pattern); damaged ones are left out, and a row
    found in two files is read once; ``notes`` says what was left out.  A ValueError when
    nothing is left to read."""
    duckdb = require("duckdb", "stepscope fleet", "parquet")
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory of step tables (profile(step_tables=DIR))")
    found, notes = list_parts(root)
    held, parts = _place(root, found, notes) if found else (None, [])
    if not parts:
        why = f" ({'; '.join(notes)})" if notes else ""
        raise ValueError(
            f"{root}: no step tables (*.parquet under run=NAME/rank=N) in this directory{why}"
        )
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    try:
        shapes = dict(con.execute(_SHAPES.format(files=_files_sql(parts))).fetchall())
    except duckdb.Error:
        bad = _damaged(con, duckdb, parts, full=False)
        if bad:
            notes.append(_damaged_note(parts, bad))
        parts = [p for p in parts if p.path not in bad]
        if not parts:
            raise ValueError(f"{root}: no readable step tables ({'; '.join(notes)})") from None
        try:
            shapes = dict(con.execute(_SHAPES.format(files=_files_sql(parts))).fetchall())
        except duckdb.Error as exc:
            raise ValueError(f"{root}: cannot read its Parquet files: {_first_line(exc)}") from None
    columns = {c.split(" ", 1)[0] for shape in shapes.values() for c in shape}
    missing = [name for name, _ in COLUMNS if name not in columns and name not in ADDED_IN_2]
    if missing:
        raise ValueError(
            f"{root}: not step tables (no column {', '.join(missing)}); point at the directory "
            "given to profile(step_tables=DIR)"
        )
    union = len({tuple(shape) for shape in shapes.values()}) > 1
    absent = tuple(name for name in ADDED_IN_2 if name not in columns)
    tables = FleetTables(con, root, parts, union, notes=notes, held=held, absent=absent)
    try:
        _read_once(tables, duckdb)
    except duckdb.Error as exc:  # a page of a file whose footer reads
        if not leave_out_damaged(tables):
            raise ValueError(f"{root}: cannot read its Parquet files: {_first_line(exc)}") from None
    return tables


def leave_out_damaged(tables: FleetTables) -> bool:
    """Leave out of ``tables`` (a new connection) the files DuckDB cannot read in full (a
    damaged page a footer read does not see); False when every file reads."""
    duckdb = require("duckdb", "stepscope fleet", "parquet")
    bad = _damaged(tables.con, duckdb, tables.parts, full=True)
    if not bad:
        return False
    tables.notes.append(_damaged_note(tables.parts, bad))
    tables.parts = [p for p in tables.parts if p.path not in bad]
    if not tables.parts:
        raise ValueError(f"{tables.path}: no readable step tables ({'; '.join(tables.notes)})")
    tables.con.close()
    tables.con = duckdb.connect()
    tables.con.execute("SET enable_progress_bar = false")
    _read_once(tables, duckdb)
    return True


def retrying(tables: FleetTables, work: Callable[[], T], what: str) -> T:
    """``work()``; when DuckDB fails on a file it cannot read in full, once more without
    the damaged files (noted); any other failure is a ValueError starting with ``what``."""
    duckdb = require("duckdb", "stepscope fleet", "parquet")
    try:
        return work()
    except duckdb.Error as exc:
        first = _first_line(exc)
    if not leave_out_damaged(tables):
        raise ValueError(f"{what}: {first}")
    try:
        return work()
    except duckdb.Error as exc:
        raise ValueError(f"{what}: {_first_line(exc)}") from None


def _read_once(tables: FleetTables, duckdb: Any) -> None:
    """Find the files that share rows (one process's overlapping steps in two files), count
    the rows read twice, and create the ``steps`` view that reads each row once."""
    con = tables.con
    try:
        spans = con.execute(_SPANS.format(files=_files_sql(tables.parts))).fetchall()
    except duckdb.Error as exc:
        raise ValueError(
            f"{tables.path}: cannot read its Parquet files: {_first_line(exc)}"
        ) from None
    by_name = {p.path: p for p in tables.parts}
    by_pid: dict[Any, list[tuple[int, int, str]]] = {}
    repeated: set[str] = set()
    for path, host_lo, host_hi, pid_lo, pid_hi, lo, hi in spans:
        one = host_lo == host_hi and pid_lo == pid_hi
        if None in (host_lo, pid_lo, lo, hi) or not one:
            repeated.add(path)  # no statistics to tell: read with the check
            continue
        by_pid.setdefault((host_lo, pid_lo), []).append((int(lo), int(hi), path))
    for spans_of_pid in by_pid.values():
        spans_of_pid.sort()
        reach, holder = None, ""
        for lo, hi, path in spans_of_pid:
            if reach is not None and lo <= reach:
                repeated.update((path, holder))
            if reach is None or hi > reach:
                reach, holder = hi, path
    repeated &= set(by_name)
    tables.repeated = frozenset(repeated)
    con.execute("CREATE TEMP TABLE dropped (filename VARCHAR, file_row_number BIGINT)")
    if repeated:
        listed = [by_name[p] for p in sorted(repeated)]
        source = _read(listed, tables.union_by_name, numbered=True)
        con.execute("DROP TABLE dropped")
        con.execute(_DROPPED.format(source=source))
        counts = con.execute(
            "SELECT filename, count(*) FROM dropped GROUP BY filename ORDER BY filename"
        ).fetchall()
        if counts:
            rows = sum(int(n) for _, n in counts)
            files = [by_name[f].shown if f in by_name else str(f) for f, _ in counts]
            tables.notes.append(
                f"{rows} rows were in more than one file (the same step of the same process: "
                f"a copied part, or a rank killed while it compacted its files) and are counted "
                f"once; left out of {_some(files)}"
            )
    nulls = "".join(f", NULL::BIGINT AS {name}" for name in tables.absent)
    con.execute(f"CREATE VIEW steps AS SELECT *{nulls} FROM {_select(tables.parts, tables)}")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_sql(tables: FleetTables, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows) of a query over the ``steps`` view; a bad query is a ValueError."""

    def run() -> tuple[list[str], list[tuple[Any, ...]]]:
        result = tables.con.execute(query)
        if result is None:  # nothing but ';', blanks or comments
            raise ValueError("--sql: the query holds no statement")
        rows = result.fetchall()
        return [d[0] for d in result.description or ()], rows

    return retrying(tables, run, "--sql")
