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
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stepscope.extras import require
from stepscope.steptables.schema import COLUMNS, PHASES, SCHEMA_VERSION

__all__ = [
    "FLEET_SCHEMA",
    "Drift",
    "FleetReport",
    "FleetTables",
    "SlowRank",
    "StepStraggler",
    "connect",
    "fleet_report",
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

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (``stepscope.fleet``)."""
        return {
            "schema": FLEET_SCHEMA,
            "version": FLEET_VERSION,
            "step_tables_version": SCHEMA_VERSION,
            **asdict(self),
        }


@dataclass
class FleetTables:
    """A DuckDB connection whose view ``steps`` reads every step table under ``path``, and the
    files of each rank (so that a query over a few ranks reads only theirs)."""

    con: Any
    path: Path
    extra: str
    """The ``run``/``rank`` columns the path itself fixes (``DIR/run=x``), as SQL."""
    union_by_name: bool
    """Whether the files' columns differ (read by name, which costs a schema read per file)."""
    rank_files: dict[int, list[str]]
    """Each rank's files, from its ``rank=N`` directory (empty when a file has none)."""

    def source(self, ranks: Iterable[int] | None = None) -> str:
        """SQL for the rows of ``ranks`` (every rank: the ``steps`` view)."""
        if ranks is None or not self.rank_files:
            return "steps"
        files = [f for r in sorted(set(ranks)) for f in self.rank_files.get(r, [])]
        if not files:
            return "(SELECT * FROM steps WHERE false)"
        listed = "[" + ", ".join(_quoted(f) for f in files) + "]"
        union = "true" if self.union_by_name else "false"
        return (
            f"(SELECT *{self.extra} FROM read_parquet({listed}, hive_partitioning = true, "
            f"union_by_name = {union}))"
        )


def connect(path: str | os.PathLike[str]) -> FleetTables:
    """The step tables under ``path`` on a DuckDB connection (the view ``steps``)."""
    duckdb = require("duckdb", "stepscope fleet", "parquet")
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory of step tables (profile(step_tables=DIR))")
    files = sorted(str(f) for f in root.rglob("*.parquet"))
    if not files:
        raise ValueError(f"{root}: no step tables (*.parquet) under this directory")
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    glob = _quoted(str(root / "**" / "*.parquet"))
    try:
        # one schema read of every file; the view then reads them by position when they agree
        (shapes,) = con.execute(
            "SELECT count(DISTINCT shape) FROM (SELECT list(name || ' ' || coalesce(type, '') "
            f"ORDER BY name) AS shape FROM parquet_schema({glob}) GROUP BY file_name)"
        ).fetchone()
        union = "true" if shapes > 1 else "false"
        source = f"read_parquet({glob}, hive_partitioning = true, union_by_name = {union})"
        columns = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        extra = _partitions_from_path(root, columns)
        con.execute(f"CREATE VIEW steps AS SELECT *{extra} FROM {source}")
    except duckdb.Error as exc:
        raise ValueError(f"{root}: cannot read its Parquet files: {_first_line(exc)}") from None
    missing = [name for name, _ in COLUMNS if name not in columns]
    if missing:
        raise ValueError(
            f"{root}: not step tables (no column {', '.join(missing)}); point at the directory "
            "given to profile(step_tables=DIR)"
        )
    return FleetTables(con, root, extra, shapes > 1, _rank_files(root, files))


def _rank_files(root: Path, files: list[str]) -> dict[int, list[str]]:
    """Each rank's files by their ``rank=N`` directory (or the root's); {} when one has none."""
    found: dict[int, list[str]] = {}
    fixed = [part for part in root.parts if part.startswith("rank=")]
    for file in files:
        parts = [p for p in Path(file).relative_to(root).parts[:-1] if p.startswith("rank=")]
        label = (parts or fixed or [""])[-1].removeprefix("rank=")
        if not label.isdigit():
            return {}
        found.setdefault(int(label), []).append(file)
    return found


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _partitions_from_path(root: Path, columns: set[str]) -> str:
    """``run``/``rank`` columns for a directory inside the partitions (``DIR/run=x``)."""
    extra = ""
    inside = {part.split("=", 1)[0]: part.split("=", 1)[1] for part in root.parts if "=" in part}
    for name in ("run", "rank"):
        if name not in columns:
            if name not in inside:
                raise ValueError(f"{root}: step tables without a {name}=... directory")
            value = inside[name]
            if name == "rank" and not value.isdigit():
                raise ValueError(f"{root}: rank={value} is not a rank number")
            extra += f", {value if name == 'rank' else _quoted(value)} AS {name}"
            columns.add(name)
    return extra


def run_sql(tables: FleetTables, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows) of a query over the ``steps`` view; a bad query is a ValueError."""
    duckdb = require("duckdb", "stepscope fleet", "parquet")
    try:
        result = tables.con.execute(query)
        rows = result.fetchall()
    except duckdb.Error as exc:
        raise ValueError(f"--sql: {_first_line(exc)}") from None
    return [d[0] for d in result.description or ()], rows


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
FROM {{source}} WHERE rank % {{stride}} = 0 GROUP BY run, step
"""

_LAG_ROWS = f"""
SELECT s.run, s.step, s.rank::INTEGER AS rank,
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
    tables = connect(path) if tables is None else tables
    con = tables.con
    # the reference reads every stride-th rank's files only; the counts come from ``lags``
    rank_dirs = len(tables.rank_files) or len(
        {p.name for p in Path(path).glob("**/rank=*") if p.is_dir()}
    )
    stride = max(1, rank_dirs // REFERENCE_RANKS)
    sampled = range(0, max(tables.rank_files, default=0) + 1, stride) if tables.rank_files else None
    con.execute(_REFERENCE.format(source=tables.source(sampled), stride=stride))
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
