"""``stepscope fleet`` on hostile directories, and step tables that cannot be written.

Huge and non-numeric ``rank=`` names, directory names DuckDB would read as globs, copied and
damaged parts and an empty query each give a report (with a note on what was left out) or one
line; a step tables directory that cannot be created never reaches the program.  The parts are
one real profile's step table, written again per rank with the rank's own pid (each rank a
process of its own).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.steptables import StepTables
from stepscope.steptables.fleet import MAX_RANK, connect, fleet_report, run_sql
from tests.test_ranks import ROOT
from tests.test_reliability_commands import stepscope as stepscope_child

pytestmark = pytest.mark.slow

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

STEPS = 6


@pytest.fixture(scope="module")
def steps_table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The step table (a pyarrow table) of STEPS steps of one real profile."""
    out = tmp_path_factory.mktemp("one")
    with stepscope.profile(step_tables=StepTables(out, run="r")) as prof:
        for _ in range(STEPS):
            prof.step()
    [written] = out.rglob("*.parquet")
    return pq.read_table(written)


def write_rank(
    root: Path, label: object, table: Any, pid: int, run: str = "r", name: str = "steps.parquet"
) -> Path:
    """``table`` as the part ``name`` of rank ``label``, its rows those of process ``pid``."""
    folder = root / f"run={run}" / f"rank={label}"
    folder.mkdir(parents=True, exist_ok=True)
    pids = pa.array([pid] * len(table), pa.int32())
    pq.write_table(
        table.set_column(table.schema.get_field_index("pid"), "pid", pids), folder / name
    )
    return folder / name


def one_line_error(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode()
    assert done.returncode == 1 and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    return err


def test_huge_rank_numbers_cost_what_the_ranks_present_cost(
    steps_table: Any, tmp_path: Path
) -> None:
    """rank=2000000000 made a set of every rank number up to it (MemoryError after 2.3 GB) and
    rank=99999999999999999999 ran on past 60 s; under a 3 GiB address space the report now
    takes what its four files take."""
    for pid, label in enumerate((0, 1, 2_000_000_000, MAX_RANK, 99999999999999999999)):
        write_rank(tmp_path / "job", label, steps_table, 100 + pid)
    out = tmp_path / "fleet.json"
    done = stepscope_child("fleet", tmp_path / "job", "--json", out, limit_bytes=3 << 30)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    report = json.loads(out.read_text())
    assert (report["ranks"], report["rows"], report["steps"]) == (4, 4 * STEPS, STEPS)
    [note] = report["notes"]
    assert "'rank=99999999999999999999' (1 files)" in note
    assert "Note: skipped directories whose rank is not a number" in done.stdout.decode()
    tables = connect(tmp_path / "job")
    _, rows = run_sql(tables, "SELECT DISTINCT rank FROM steps ORDER BY rank")
    assert rows == [(0,), (1,), (2_000_000_000,), (MAX_RANK,)]


@pytest.mark.parametrize("name", ["t*", "t[1]", "q?", "b\\s", "c\\[x]", "r'*"])
def test_a_directory_name_is_only_a_name(steps_table: Any, tmp_path: Path, name: str) -> None:
    """``t*``, ``t[1]``, ``q?`` read their siblings' tables too, and a backslash found
    nothing: the name was a DuckDB glob."""
    siblings = ["t1", "tx", "q1", "qq", "b\\s", "bs", "c\\[x]", "cx", "r'1", name]
    for i, sibling in enumerate(dict.fromkeys(siblings)):
        write_rank(tmp_path / sibling, 0, steps_table, 100 + i, run=f"n{i}")
    own = f"n{list(dict.fromkeys(siblings)).index(name)}"
    report = fleet_report(tmp_path / name)
    assert (report.runs, report.rows, report.ranks, report.notes) == ([own], STEPS, 1, [])
    _, rows = run_sql(connect(tmp_path / name), "SELECT DISTINCT run FROM steps")
    assert rows == [(own,)]


def test_a_copied_part_is_counted_once_with_a_note(steps_table: Any, tmp_path: Path) -> None:
    """A part copied beside itself and a rank directory copied as another rank gave 4 ranks
    and the copied rows twice, without a word."""
    job = tmp_path / "job"
    for rank in range(3):
        write_rank(job, rank, steps_table, 100 + rank)
    assert connect(job).repeated == frozenset()  # no copy: no file is read with the check
    rank0 = job / "run=r" / "rank=0"
    shutil.copy(rank0 / "steps.parquet", rank0 / "steps-copy.parquet")
    shutil.copytree(rank0, job / "run=r" / "rank=3")
    report = fleet_report(job)
    assert (report.rows, report.ranks, report.steps) == (3 * STEPS, 3, STEPS)
    [note] = report.notes
    assert f"{3 * STEPS} rows were in more than one file" in note and "counted once" in note
    left_out = note.split("left out of ")[1].split(", ")
    # the lowest rank keeps the rows, from one of its two files
    assert sorted(left_out)[1:] == ["run=r/rank=3/steps-copy.parquet", "run=r/rank=3/steps.parquet"]
    assert sorted(left_out)[0] in ("run=r/rank=0/steps-copy.parquet", "run=r/rank=0/steps.parquet")
    tables = connect(job)
    assert run_sql(tables, "SELECT count(*) FROM steps")[1] == [(3 * STEPS,)]
    # the rows of only some ranks (the report's reference and slow-rank reads) are read once too
    subset = tables.source([0, 3])
    assert tables.con.execute(f"SELECT count(*) FROM {subset}").fetchall() == [(STEPS,)]


def test_two_profiles_of_one_process_are_not_copies(steps_table: Any, tmp_path: Path) -> None:
    """The same steps of the same process at other times (a second profile) are kept."""
    write_rank(tmp_path, 0, steps_table, 100)
    later = steps_table.set_column(
        steps_table.schema.get_field_index("start_unix_ns"),
        "start_unix_ns",
        pa.compute.add(steps_table.column("start_unix_ns"), 10**9),
    )
    write_rank(tmp_path, 0, later, 100, name="second.parquet")
    report = fleet_report(tmp_path)
    assert (report.rows, report.ranks, report.notes) == (2 * STEPS, 1, [])


def test_ranks_that_are_no_numbers_are_skipped_and_named(steps_table: Any, tmp_path: Path) -> None:
    """``abc``, ``..``, ``1e3``, ``٣``, ``²`` gave ``internal error: BinderException``."""
    labels = ["abc", "..", "1e3", "\u0663", "\u00b2", "-1", "", "0x1"]
    for pid, label in enumerate([0, 1, *labels]):
        write_rank(tmp_path, label, steps_table, 100 + pid)
    done = stepscope_child("fleet", tmp_path)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0 and "internal error" not in err, err
    assert f"{2 * STEPS} step rows: 2 ranks" in out
    report = fleet_report(tmp_path)
    [note] = report.notes
    for label in labels:
        assert repr(f"rank={label}") in note, (label, note)
    sql = stepscope_child("fleet", tmp_path, "--sql", "SELECT count(*) AS n FROM steps")
    assert sql.returncode == 0 and str(2 * STEPS) in sql.stdout.decode()
    assert "stepscope fleet: note: skipped directories whose rank" in sql.stderr.decode()


@pytest.mark.parametrize("query", [";", "  ;  ; ", "-- nothing"])
def test_a_query_without_a_statement_is_one_line(
    steps_table: Any, tmp_path: Path, query: str
) -> None:
    """``--sql ';'`` gave ``internal error: AttributeError``."""
    write_rank(tmp_path, 0, steps_table, 100)
    err = one_line_error(stepscope_child("fleet", tmp_path, "--sql", query))
    assert "--sql: the query holds no statement" in err


def test_damaged_parts_are_skipped_and_named(steps_table: Any, tmp_path: Path) -> None:
    """One damaged part failed the whole report: zero bytes, cut short, not Parquet, and a
    footer that reads over a data page that does not."""
    job = tmp_path / "job"
    for rank in range(3):
        write_rank(job, rank, steps_table, 100 + rank)
    whole = (job / "run=r" / "rank=0" / "steps.parquet").read_bytes()
    for rank, data in (
        (3, b""),
        (4, whole[: len(whole) // 2]),
        (5, b"not parquet at all, and long enough to have a footer of sorts"),
    ):
        (job / "run=r" / f"rank={rank}").mkdir()
        (job / "run=r" / f"rank={rank}" / "bad.parquet").write_bytes(data)
    paged = write_rank(job, 6, steps_table, 106)
    page = bytearray(paged.read_bytes())
    page[4:60] = b"\xff" * 56  # the first column's first page; the footer is whole
    paged.write_bytes(bytes(page))
    assert pq.read_metadata(paged).num_rows == STEPS
    done = stepscope_child("fleet", job, "--json", tmp_path / "f.json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads((tmp_path / "f.json").read_text())
    assert (report["rows"], report["ranks"]) == (3 * STEPS, 3)
    said = " ".join(report["notes"])
    for rank in (3, 4, 5, 6):
        assert f"rank={rank}/" in said, said
    assert "stepscope-fleet-" not in said  # named below the directory given
    query = "SELECT count(*) AS n, sum(step) AS s FROM steps"  # values, not counts of footers
    sql = stepscope_child("fleet", job, "--sql", query, "--json", tmp_path / "q.json")
    assert sql.returncode == 0, sql.stderr
    assert json.loads((tmp_path / "q.json").read_text())["rows"] == [[3 * STEPS, 3 * 15]]
    assert "rank=6/steps.parquet" in sql.stderr.decode()
    for rank in range(3):
        shutil.rmtree(job / "run=r" / f"rank={rank}")
    err = one_line_error(stepscope_child("fleet", job))
    assert "no readable step tables" in err and "rank=3/bad.parquet" in err


_UNWRITABLE = """
import sys
import stepscope
from stepscope.failures import failure_counts

for _ in range(2):
    with stepscope.profile(step_tables=sys.argv[1]) as prof:
        for _ in range(3):
            prof.step()
print("trained", failure_counts()["step_tables"], flush=True)
"""


def test_a_step_tables_directory_that_cannot_be_created_never_stops_the_program(
    tmp_path: Path,
) -> None:
    """``profile.start()`` raised the OSError into the program; now it is reported once on
    stderr and counted, and the program's output and exit status are its own."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = subprocess.run(
        [sys.executable, "-c", _UNWRITABLE, str(blocker / "tables")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained {'OSError': 2}\n"
    assert done.stderr.count("\n") == 1, done.stderr  # once, for both profiles
    assert "cannot create the step tables directory" in done.stderr
    assert "this profile writes none; the program runs on" in done.stderr
    prof = stepscope.profile(step_tables=blocker / "tables", strict=True)
    with pytest.raises(OSError, match="cannot create the step tables directory"):
        prof.start()  # strict: raised, and nothing left running
    with stepscope.profile() as other:
        other.step()
