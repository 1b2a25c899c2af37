"""Who is slow across a job, from the step tables, on DuckDB: per step the rank that lags the
others most, ranks slow since a step and in which phase, and drift over the run.

A rank's *lag* in a phase at a step is how much longer it spent there than a typical fast rank
(the ``REFERENCE_QUANTILE`` of the ranks; 0 when less).  Only phases a rank spends on its own
count (``schema.PHASES``: data wait, optimizer, GC, the training thread's CPU time): a
synchronous job's step durations are equal on every rank, since the fast ranks wait for the slow
one inside collectives.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stepscope.extras import require
from stepscope.steptables.schema import COLUMNS, PHASES, SCHEMA_VERSION

__all__ = [
    "FLEET_SCHEMA",
    "Drift",
    "FleetReport",
    "FleetTables",
    "Part",
    "SlowRank",
    "StepStraggler",
    "connect",
    "fleet_report",
    "leave_out_damaged",
    "list_parts",
    "rank_number",
    "run_sql",
]

FLEET_SCHEMA = "stepscope.fleet"
FLEET_VERSION = 1
REFERENCE_QUANTILE = 0.25
"""Lags are measured from this quantile of the ranks (a typical fast rank; with two ranks, the
faster one)."""
REFERENCE_RANKS = 256
"""With more ranks than this, the reference comes from every k-th rank (about this many), which
reads a k-th of the files: the quantile of a few hundred ranks is as good as of all."""
MIN_LAG_NS = 1_000_000
"""A rank lags at a step when it lags by more than this and ``LAG_FRACTION`` of the median step."""
LAG_FRACTION = 0.05
SINCE_SHARE = 0.8
"""A rank is slow since step S when it lags in this share of its steps from S on (of such steps,
the one after which its lagging steps are best told from the others: a one-step blip before
a level shift is not where it started)."""
MIN_SLOW_STEPS = 3
DRIFT_PARTS = 10
T = TypeVar("T")


@dataclass(frozen=True)
class StepStraggler:
    """The rank that lagged most at one step."""

    run: str
    step: int
    rank: int
    lag_ns: int
    phase: str
    mean_duration_ns: int
    ranks: int


@dataclass(frozen=True)
class SlowRank:
    """A rank that lags in most steps since ``since_step``, mostly in ``phase``."""

    run: str
    rank: int
    since_step: int
    steps: int
    slow_steps: int
    mean_lag_ns: int
    phase: str


@dataclass(frozen=True)
class Drift:
    """One tenth of the run's steps: the median of the steps' mean durations and of every
    rank's lag."""

    run: str
    part: int
    first_step: int
    last_step: int
    median_duration_ns: int
    median_lag_ns: int


@dataclass
class FleetReport:
    """Everything ``stepscope fleet`` says about a directory of step tables."""

    path: str
    rows: int
    runs: list[str]
    ranks: int
    steps: int
    stragglers: list[StepStraggler] = field(default_factory=list)
    slow_ranks: list[SlowRank] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What was left out of the tables read (files, directories) or counted once."""

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (``stepscope.fleet``)."""
        return {
            "schema": FLEET_SCHEMA,
            "version": FLEET_VERSION,
            "step_tables_version": SCHEMA_VERSION,
            **asdict(self),
        }


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
        return _select([p for p in self.parts if p.rank in wanted], self)


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
    missing = [name for name, _ in COLUMNS if name not in columns]
    if missing:
        raise ValueError(
            f"{root}: not step tables (no column {', '.join(missing)}); point at the directory "
            "given to profile(step_tables=DIR)"
        )
    union = len({tuple(shape) for shape in shapes.values()}) > 1
    tables = FleetTables(con, root, parts, union, notes=notes, held=held)
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


def _retrying(tables: FleetTables, work: Callable[[], T], what: str) -> T:
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
    con.execute(f"CREATE VIEW steps AS SELECT * FROM {_select(tables.parts, tables)}")


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

    return _retrying(tables, run, "--sql")


_NAMES = [p.removesuffix("_ns") for p in PHASES]
_LAG_COLUMNS = [f"greatest(s.{p} - m.{p}, 0)" for p in PHASES]


def _top_phase(values: list[str]) -> str:
    """SQL giving the index (into ``_NAMES``) of the largest of ``values``."""
    top = f"greatest({', '.join(values)})"
    cases = " ".join(f"WHEN {v} = {top} THEN {i}" for i, v in enumerate(values))
    return f"CASE {cases} END"


_REFERENCE = f"""
CREATE TEMP TABLE reference AS
SELECT run, step, avg(duration_ns) AS duration_ns,
       {", ".join(f"quantile_disc({p}, {REFERENCE_QUANTILE}) AS {p}" for p in PHASES)}
FROM {{source}} GROUP BY run, step
"""

_LAG_ROWS = f"""
SELECT s.run, s.step, s.rank::BIGINT AS rank,
       {" + ".join(_LAG_COLUMNS)} AS lag_ns,
       {", ".join(f"{c} AS {n}_lag" for c, n in zip(_LAG_COLUMNS, _NAMES, strict=True))},
       ({" + ".join(_LAG_COLUMNS)}) > greatest({MIN_LAG_NS}, {LAG_FRACTION} * m.duration_ns)
           AS slow
FROM {{source}} s JOIN reference m USING (run, step)
"""
"""Each row's lag in each phase and whether the rank lags at that step."""

# one scan of every row, aggregated per step (stragglers and drift) and per rank (the slow
# ones) at once; the rows themselves are not kept
_PASSES = f"""
CREATE TEMP TABLE passes AS
WITH lags AS ({_LAG_ROWS.format(source="steps")})
SELECT run, step, rank, GROUPING(step) AS by_rank,
       arg_max(rank, lag_ns) AS top_rank, max(lag_ns)::BIGINT AS top_lag_ns,
       arg_max({_top_phase([f"{n}_lag" for n in _NAMES])}, lag_ns) AS phase,
       count(*) AS ranks, median(lag_ns) AS median_lag_ns, sum(slow::INT) AS slow_steps
FROM lags GROUP BY GROUPING SETS ((run, step), (run, rank))
"""

_PER_STEP = """
CREATE TEMP TABLE per_step AS
SELECT run, step, top_rank AS rank, top_lag_ns AS lag_ns, phase, ranks, median_lag_ns
FROM passes WHERE by_rank = 0
"""

_PER_RANK = """
CREATE TEMP TABLE per_rank AS SELECT run, rank, slow_steps FROM passes WHERE by_rank = 1
"""

_CANDIDATES = f"SELECT DISTINCT rank FROM per_rank WHERE slow_steps >= {MIN_SLOW_STEPS}"

# the lag rows again, of the ranks slow in enough steps only (few, in a healthy job: their
# files alone are read)
_LAGS = "CREATE TEMP TABLE lags AS " + _LAG_ROWS

_STRAGGLERS = """
SELECT p.run, p.step, p.rank, p.lag_ns, p.phase, m.duration_ns::BIGINT, p.ranks
FROM per_step p JOIN reference m USING (run, step) ORDER BY p.run, p.step
"""

# the window runs only over ranks slow in enough steps (few, in a healthy job)
_SLOW_RANKS = f"""
WITH picked AS (
    SELECT l.* FROM lags l SEMI JOIN (
        SELECT run, rank FROM per_rank WHERE slow_steps >= {MIN_SLOW_STEPS}
    ) c ON l.run = c.run AND l.rank = c.rank
), suffix AS (
    SELECT run, rank, step, slow,
           sum(slow::INT) OVER w AS slow_after, count(*) OVER w AS steps_after,
           sum(slow::INT) OVER (PARTITION BY run, rank) AS slow_total
    FROM picked
    WINDOW w AS (PARTITION BY run, rank ORDER BY step DESC
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), since AS (
    -- of the steps it may be slow since, the one that best splits its steps into fast before
    -- and slow after (fewest slow steps before plus fast steps after; the later on a tie): a
    -- blip a few steps before a shift does not move the shift there
    SELECT run, rank, step AS since_step FROM suffix
    WHERE slow AND slow_after >= {SINCE_SHARE} * steps_after AND slow_after >= {MIN_SLOW_STEPS}
    QUALIFY row_number() OVER (
        PARTITION BY run, rank ORDER BY slow_total - 2 * slow_after + steps_after, step DESC
    ) = 1
)
SELECT l.run, l.rank, any_value(since.since_step), count(*), sum(l.slow::INT),
       avg(l.lag_ns)::BIGINT, {_top_phase([f"sum({n}_lag)" for n in _NAMES])}
FROM picked l JOIN since USING (run, rank)
WHERE l.step >= since.since_step
GROUP BY l.run, l.rank ORDER BY avg(l.lag_ns) DESC
"""

_DRIFT = f"""
WITH parts AS (
    SELECT p.run, p.step, m.duration_ns AS step_ns, p.median_lag_ns,
           ntile({DRIFT_PARTS}) OVER (PARTITION BY p.run ORDER BY p.step) AS part
    FROM per_step p JOIN reference m USING (run, step)
)
SELECT run, part, min(step), max(step), median(step_ns)::BIGINT, median(median_lag_ns)::BIGINT
FROM parts GROUP BY run, part ORDER BY run, part
"""


def _ints(values: tuple[Any, ...]) -> tuple[int, int, int, int, int]:
    a, b, c, d, e = (int(v) for v in values)
    return a, b, c, d, e


def _phase(index: int, lag_ns: float) -> str:
    return _NAMES[index] if lag_ns > 0 else "-"


def fleet_report(path: str | os.PathLike[str], tables: FleetTables | None = None) -> FleetReport:
    """The fleet report of the step tables under ``path``."""
    found = connect(path) if tables is None else tables
    report = _retrying(
        found, lambda: _report(path, found), f"{path}: cannot read its Parquet files"
    )
    report.notes = list(found.notes)
    return report


def _report(path: str | os.PathLike[str], tables: FleetTables) -> FleetReport:
    con = tables.con
    for table in ("reference", "passes", "per_step", "per_rank", "lags"):
        con.execute(f"DROP TABLE IF EXISTS {table}")  # a second try on the same connection
    # the reference reads every stride-th rank's files only (of the ranks present: work in
    # proportion to them, whatever their numbers); the counts come from ``lags``
    present = sorted(tables.rank_files)
    stride = max(1, len(present) // REFERENCE_RANKS)
    con.execute(_REFERENCE.format(source=tables.source(present[::stride])))
    con.execute(_PASSES)
    con.execute(_PER_STEP)
    con.execute(_PER_RANK)
    candidates = [int(r) for (r,) in con.execute(_CANDIDATES).fetchall()]
    con.execute(_LAGS.format(source=tables.source(candidates)))
    rows, runs, steps = con.execute(
        "SELECT sum(ranks), list(DISTINCT run ORDER BY run), count(*) FROM per_step"
    ).fetchone()
    (ranks,) = con.execute("SELECT count(DISTINCT rank) FROM per_rank").fetchone()
    report = FleetReport(str(path), int(rows), [str(r) for r in runs], int(ranks), int(steps))
    report.stragglers = [
        StepStraggler(
            str(r[0]), int(r[1]), int(r[2]), int(r[3]), _phase(r[4], r[3]), int(r[5]), int(r[6])
        )
        for r in con.execute(_STRAGGLERS).fetchall()
    ]
    report.slow_ranks = [
        SlowRank(str(r[0]), *_ints(r[1:6]), _phase(r[6], r[5]))
        for r in con.execute(_SLOW_RANKS).fetchall()
    ]
    report.drift = [Drift(str(r[0]), *_ints(r[1:6])) for r in con.execute(_DRIFT).fetchall()]
    return report
