"""Who is slow across a job, from the step tables, on DuckDB: the rank the others waited for,
since which step, in which phase and how the wait spread to them; per step the rank that lags
the others most; and drift over the run.

A synchronous job's step *durations* are equal on every rank (the fast ranks wait for the slow
one inside collectives), so ranks are compared on their *busy* time, the step outside
collectives (``collective_ns``, schema version 2), split into phases (``PHASES``): data wait,
optimizer, GC, and the rest — ``compute`` (its CPU time: forward and backward on the host) and
``host`` (the rest off the CPU: sleeps, I/O, locks, waiting for a device).  A rank's *lag* in a
phase at a step is how much longer it spent there than a typical fast rank (the
``REFERENCE_QUANTILE`` of the ranks; 0 when less); its lag at a step is the sum over phases.
Version-1 tables have no collective time: there ``compute`` is the CPU time outside GC and the
optimizer, and ``host`` is 0 (the rest of their step includes the waits for the others).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from stepscope.steptables.reading import (
    MAX_RANK,
    FleetTables,
    Part,
    connect,
    leave_out_damaged,
    list_parts,
    rank_number,
    retrying,
    run_sql,
)
from stepscope.steptables.schema import SCHEMA_VERSION

__all__ = [
    "FLEET_SCHEMA",
    "MAX_RANK",
    "PHASES",
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
FLEET_VERSION = 2
PHASES = ("data_wait", "optimizer", "gc", "compute", "host")
"""What a rank's busy time is split into; a lag is named by the phase it is largest in."""
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
MIN_SLOW_STEPS = 5
"""A rank slow in fewer steps than this is a passing straggler (each step's is in ``stragglers``),
not a rank slow since a step: on a busy machine any rank lags in a few steps in a row."""
LEVEL_SHARE = 0.5
"""A rank that lags in ``MIN_SLOW_STEPS`` steps or more lags at a step (for "slow since") only
when its lag there is also over this share of its slow level, the median of its lags beyond the
floor: noise a fraction of the slowness it is named for does not move where that started."""
COMPUTE_SHARE = 0.1
"""A lag outside data wait, optimizer and GC is named ``compute`` when this share of it or
more ran on the CPU: a thread computing on a shared machine is also descheduled (its wall time
grows beyond its CPU time), a sleeping one is never on the CPU.  In the fault-injection runs
(docs/step-tables.md) a sleep's share was 0.03-0.06, extra compute's 0.15-0.97."""
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
    """Its busy time beyond the reference's, per step since ``since_step`` (the sum of
    ``phases``)."""
    phase: str
    phases: dict[str, int] = field(default_factory=dict)
    """Its mean lag per step since ``since_step`` in each phase."""
    collective_ns: int | None = None
    """Its median time in collectives per step since ``since_step`` (None: version-1 tables)."""
    others_collective_ns: int | None = None
    """The other ranks' (the median over them of each one's median per step) since then."""
    waited_ns: int | None = None
    """How long the others waited for it per step since then: ``others_collective_ns -
    collective_ns``."""
    waited_before_ns: int | None = None
    """The same before ``since_step`` (None: it was slow from the first step)."""
    waiting_ranks: int | None = None
    """Other ranks that spent more than a lag (``MIN_LAG_NS``, ``LAG_FRACTION`` of a step)
    longer in collectives than it per step since then: those the wait spread to."""
    least_wait: bool | None = None
    """No other rank spent less time in collectives per step since then."""


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
    """What was left out of the tables read (files, directories) or counted once, and the
    lagging ranks nobody waited for."""

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (``stepscope.fleet``)."""
        return {
            "schema": FLEET_SCHEMA,
            "version": FLEET_VERSION,
            "step_tables_version": SCHEMA_VERSION,
            **asdict(self),
        }


_OTHER = "greatest(duration_ns - collective_ns - data_wait_ns - optimizer_ns - gc_ns, 0)"
"""A version-2 row's busy time outside data wait, the optimizer and GC."""
_OWN_CPU = "greatest(cpu_ns - gc_ns - optimizer_ns, 0)"
"""Its CPU time outside GC and the optimizer (both run on the CPU)."""
_PHASE_SQL = (
    "data_wait_ns",
    "optimizer_ns",
    "gc_ns",
    f"CASE WHEN collective_ns IS NULL THEN {_OWN_CPU} ELSE least({_OTHER}, {_OWN_CPU}) END",
    f"CASE WHEN collective_ns IS NULL THEN 0 ELSE {_OTHER} - least({_OTHER}, {_OWN_CPU}) END",
)
"""Each of ``PHASES`` of a row, in SQL."""
_LAG_COLUMNS = [f"greatest(s.{p} - m.{p}, 0)" for p in PHASES]


def _phased(source: str) -> str:
    """SQL for the rows of ``source`` with each of ``PHASES`` as a column."""
    phases = ", ".join(f"{sql} AS {name}" for sql, name in zip(_PHASE_SQL, PHASES, strict=True))
    return f"(SELECT run, step, rank, duration_ns, {phases} FROM {source})"


def _top_phase(values: list[str]) -> str:
    """SQL giving the index (into ``PHASES``) of the phase named for ``values`` (lags in
    ``PHASES`` order): the largest of data wait, optimizer, GC and the rest, and the rest is
    ``compute`` when ``COMPUTE_SHARE`` of its lag or more ran on the CPU, else ``host``."""
    data, optimizer, gc, compute, host = values
    rest = f"({compute} + {host})"
    top = f"greatest({data}, {optimizer}, {gc}, {rest})"
    return (
        f"CASE WHEN {data} = {top} THEN 0 WHEN {optimizer} = {top} THEN 1 "
        f"WHEN {gc} = {top} THEN 2 WHEN {compute} >= {COMPUTE_SHARE} * {rest} THEN 3 ELSE 4 END"
    )


_REFERENCE = f"""
CREATE TEMP TABLE reference AS
SELECT run, step, avg(duration_ns) AS duration_ns,
       {", ".join(f"quantile_disc({p}, {REFERENCE_QUANTILE}) AS {p}" for p in PHASES)}
FROM {{source}} GROUP BY run, step
"""

_LAG_ROWS = f"""
SELECT s.run, s.step, s.rank::BIGINT AS rank,
       {" + ".join(_LAG_COLUMNS)} AS lag_ns,
       {", ".join(f"{c} AS {n}_lag" for c, n in zip(_LAG_COLUMNS, PHASES, strict=True))},
       greatest({MIN_LAG_NS}, {LAG_FRACTION} * m.duration_ns) AS floor_ns,
       ({" + ".join(_LAG_COLUMNS)}) > floor_ns AS slow
FROM {{source}} s JOIN reference m USING (run, step)
"""
"""Each row's lag in each phase and whether the rank lags at that step (by the floor alone)."""

# one scan of every row, aggregated per step (stragglers and drift) and per rank (the slow
# ones) at once; the rows themselves are not kept
_PASSES = f"""
CREATE TEMP TABLE passes AS
WITH lags AS ({_LAG_ROWS.format(source=_phased("steps"))})
SELECT run, step, rank, GROUPING(step) AS by_rank,
       arg_max(rank, lag_ns) AS top_rank, max(lag_ns)::BIGINT AS top_lag_ns,
       arg_max({_top_phase([f"{n}_lag" for n in PHASES])}, lag_ns) AS phase,
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
WITH candidates AS (
    SELECT l.* EXCLUDE (slow) FROM lags l SEMI JOIN (
        SELECT run, rank FROM per_rank WHERE slow_steps >= {MIN_SLOW_STEPS}
    ) c ON l.run = c.run AND l.rank = c.rank
), levels AS (
    SELECT run, rank, median(lag_ns) FILTER (WHERE lag_ns > floor_ns) AS level_ns
    FROM candidates GROUP BY run, rank
), picked AS (
    -- lagging at a step: beyond the floor and half the rank's own slow level, so that the
    -- shorter lags of a noisy machine before a shift are not taken for its start
    SELECT c.*, c.lag_ns > greatest(c.floor_ns, {LEVEL_SHARE} * v.level_ns) AS slow
    FROM candidates c JOIN levels v USING (run, rank)
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
       avg(l.lag_ns)::BIGINT, {_top_phase([f"sum({n}_lag)" for n in PHASES])},
       {", ".join(f"avg({n}_lag)::BIGINT" for n in PHASES)}
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
    return PHASES[index] if lag_ns > 0 else "-"


def fleet_report(path: str | os.PathLike[str], tables: FleetTables | None = None) -> FleetReport:
    """The fleet report of the step tables under ``path``."""
    found = connect(path) if tables is None else tables
    report = retrying(found, lambda: _report(path, found), f"{path}: cannot read its Parquet files")
    report.notes = [*found.notes, *report.notes]
    return report


def _report(path: str | os.PathLike[str], tables: FleetTables) -> FleetReport:
    con = tables.con
    for table in ("reference", "passes", "per_step", "per_rank", "lags"):
        con.execute(f"DROP TABLE IF EXISTS {table}")  # a second try on the same connection
    # the reference reads every stride-th rank's files only (of the ranks present: work in
    # proportion to them, whatever their numbers); the counts come from ``lags``
    present = sorted(tables.rank_files)
    stride = max(1, len(present) // REFERENCE_RANKS)
    con.execute(_REFERENCE.format(source=_phased(tables.source(present[::stride]))))
    con.execute(_PASSES)
    con.execute(_PER_STEP)
    con.execute(_PER_RANK)
    candidates = [int(r) for (r,) in con.execute(_CANDIDATES).fetchall()]
    con.execute(_LAGS.format(source=_phased(tables.source(candidates))))
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
    found = con.execute(_SLOW_RANKS).fetchall()
    report.slow_ranks = [
        SlowRank(
            str(r[0]),
            *_ints(r[1:6]),
            _phase(r[6], r[5]),
            {name: int(v) for name, v in zip(PHASES, r[7:], strict=True)},
        )
        for r in found
    ]
    report.slow_ranks = _with_waits(con, report.slow_ranks, report.notes)
    report.drift = [Drift(str(r[0]), *_ints(r[1:6])) for r in con.execute(_DRIFT).fetchall()]
    return report


def _with_waits(con: Any, slow: list[SlowRank], notes: list[str]) -> list[SlowRank]:
    """Each slow rank with the collective time of every rank since and before its first slow
    step: who waited for it, how long, and how far the wait spread (one scan of the
    ``collective_ns`` column for them all).  A rank the others did not wait for, though they
    spent time in collectives, is left out, with a note."""
    if not slow:
        return slow
    cuts = sorted({(s.run, s.since_step) for s in slow})
    columns, params = [], []
    for run, since in cuts:
        columns.append("median(collective_ns) FILTER (WHERE run = ? AND step >= ?)")
        columns.append("median(collective_ns) FILTER (WHERE run = ? AND step < ?)")
        params += [run, since, run, since]
    means = {
        int(rank): values
        for rank, *values in con.execute(
            f"SELECT rank::BIGINT, {', '.join(columns)} FROM steps GROUP BY rank", params
        ).fetchall()
    }
    found = []
    for s in slow:
        (mean_step,) = con.execute(
            "SELECT avg(duration_ns) FROM reference WHERE run = ? AND step >= ?",
            [s.run, s.since_step],
        ).fetchone()
        at = 2 * cuts.index((s.run, s.since_step))
        after = {r: v[at] for r, v in means.items() if v[at] is not None}
        before = {r: v[at + 1] for r, v in means.items() if v[at + 1] is not None}
        own = after.get(s.rank)
        others = [v for r, v in after.items() if r != s.rank]
        if own is None or not others:
            found.append(s)
            continue
        middle = statistics.median(others)
        threshold = max(MIN_LAG_NS, LAG_FRACTION * float(mean_step or 0))
        if middle > 0 and middle - own <= threshold:  # the others were in collectives, and
            notes.append(  # not waiting for it: its lag cost nobody anything
                f"rank {s.rank} of run {s.run} lagged the others since step {s.since_step} "
                f"({s.mean_lag_ns / 1e6:,.1f} ms a step, {s.phase}), but they did not wait for "
                f"it at collectives ({(middle - own) / 1e6:,.1f} ms a step): not named"
            )
            continue
        earlier = [v for r, v in before.items() if r != s.rank]
        waited_before = (
            int(statistics.median(earlier) - before[s.rank])
            if earlier and s.rank in before
            else None
        )
        found.append(
            SlowRank(
                **{
                    **asdict(s),
                    "collective_ns": int(own),
                    "others_collective_ns": int(middle),
                    "waited_ns": int(middle - own),
                    "waited_before_ns": waited_before,
                    "waiting_ranks": sum(1 for v in others if v - own > threshold),
                    "least_wait": own <= min(others),
                }
            )
        )
    return found
