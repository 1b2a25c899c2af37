"""``stepscope fleet``'s "slow since step S": a one-step blip before a rank's real level shift
is not where it started (issue 36, item 7: the change point came 3 steps early on a one-step
blip), and the shift itself is found at its step."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.steptables.fleet import fleet_report
from stepscope.steptables.schema import INT_COLUMNS, SCHEMA_VERSION, arrow_schema

pytestmark = pytest.mark.implementation_independent

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

MS = 1_000_000
STEPS = 60
RANKS = 4
SHIFT = 30
SLOW_RANK = 2


def data_waits(extra_wait_ms: dict[int, float]) -> list[list[int]]:
    """Each rank's data wait per step: 5 ms plus a little noise, and on ``SLOW_RANK`` the
    extra milliseconds given for the step."""
    return [
        [
            int((5 + (step * 7 + rank * 3) % 5 * 0.1) * MS)
            + int((extra_wait_ms.get(step, 0.0) if rank == SLOW_RANK else 0) * MS)
            for step in range(STEPS)
        ]
        for rank in range(RANKS)
    ]


def write_tables(
    root: Path, extra_wait_ms: dict[int, float], others_optimizer_ms: float = 0.0
) -> Path:
    """Step tables of a synchronous 4-rank job where every rank spends 70 ms a step on its
    own (10 of them in the optimizer, and on the ranks other than ``SLOW_RANK``
    ``others_optimizer_ms`` more in the steps it waits for its data longer) besides its data
    wait (``data_waits``), and a step ends 20 ms after the last rank's busy time ends, at a
    collective that all of them were in until then: the others wait for the slowest there."""
    schema = arrow_schema()
    waits = data_waits(extra_wait_ms)
    optimizer = [
        [
            int(
                (10 + (others_optimizer_ms if rank != SLOW_RANK and step in extra_wait_ms else 0))
                * MS
            )
            for step in range(STEPS)
        ]
        for rank in range(RANKS)
    ]
    busy = [
        [w + o + 60 * MS for w, o in zip(wait, opt, strict=True)]
        for wait, opt in zip(waits, optimizer, strict=True)
    ]
    durations = [max(b[step] for b in busy) + 20 * MS for step in range(STEPS)]
    for rank in range(RANKS):
        rows: dict[str, list[object]] = {name: [] for name, _ in INT_COLUMNS}
        collective: list[int] = []
        for step in range(STEPS):
            wait, duration = waits[rank][step], durations[step]
            collective.append(duration - busy[rank][step])
            values = {
                "step": step,
                "start_unix_ns": 1_700_000_000_000_000_000 + step * 200 * MS,
                "duration_ns": duration,
                "data_wait_ns": wait,
                "optimizer_ns": optimizer[rank][step],
                "gc_ns": 0,
                "cpu_ns": 60 * MS + optimizer[rank][step],
                "rss_bytes": 1 << 30,
            }
            for name, _ in INT_COLUMNS:
                rows[name].append(values[name])
        table = pa.table(
            {
                **rows,
                "recorded": [False] * STEPS,
                "host": ["h"] * STEPS,
                "pid": [100 + rank] * STEPS,
                "schema_version": [SCHEMA_VERSION] * STEPS,
                "host_computation_ns": [None] * STEPS,
                "host_communication_ns": [None] * STEPS,
                "host_idle_ns": [None] * STEPS,
                "host_categories": [None] * STEPS,
                "collective_ns": collective,
                "busy_ns": [d - c for d, c in zip(durations, collective, strict=True)],
            },
            schema=schema,
        )
        directory = root / "run=job" / f"rank={rank}"
        directory.mkdir(parents=True)
        pq.write_table(table, directory / "part-0.parquet")
    return root


def slow_ranks(root: Path) -> list[tuple[int, int, str]]:
    return [(s.rank, s.since_step, s.phase) for s in fleet_report(root).slow_ranks]


def shifted(extra: dict[int, float] | None = None) -> dict[int, float]:
    """20 ms more from step SHIFT on, and ``extra`` on other steps."""
    return {**{step: 20.0 for step in range(SHIFT, STEPS)}, **(extra or {})}


def test_a_level_shift_is_found_at_its_step(tmp_path: Path) -> None:
    assert slow_ranks(write_tables(tmp_path, shifted())) == [(SLOW_RANK, SHIFT, "data_wait")]


@pytest.mark.parametrize("before", [1, 2, 3, 5])
def test_a_one_step_blip_before_the_shift_is_not_where_it_started(
    tmp_path: Path, before: int
) -> None:
    tables = write_tables(tmp_path, shifted({SHIFT - before: 25.0}))
    assert slow_ranks(tables) == [(SLOW_RANK, SHIFT if before > 1 else SHIFT - 1, "data_wait")]


def test_a_shift_with_a_quiet_step_inside_is_still_found_at_its_step(tmp_path: Path) -> None:
    tables = write_tables(tmp_path, shifted({SHIFT + 4: 0.0, SHIFT + 11: 0.0}))
    assert slow_ranks(tables) == [(SLOW_RANK, SHIFT, "data_wait")]


def test_a_lone_blip_is_no_slow_rank(tmp_path: Path) -> None:
    assert slow_ranks(write_tables(tmp_path, {SHIFT: 25.0})) == []


def test_a_rank_the_others_did_not_wait_for_is_not_named(tmp_path: Path) -> None:
    """Rank 2 waits 20 ms more for its data from step 30, but the others spend 20 ms more in
    their optimizer then: every rank lags another in some phase, nobody waits at the
    collective, so nobody is named, and a note says why."""
    report = fleet_report(write_tables(tmp_path, shifted(), others_optimizer_ms=20.0))
    assert report.slow_ranks == []
    assert any("did not wait for it" in note for note in report.notes), report.notes
