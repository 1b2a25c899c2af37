"""Metric tables: registration, enabling by configuration, CSV layout, concurrent appends."""

from __future__ import annotations

import csv
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope import tables
from stepscope.config import config
from stepscope.tables import MetricTable, get_metric_table

pytestmark = pytest.mark.implementation_independent

SEED_TABLES = {
    "slow_fusion": [
        "kernel1_path", "kernel1_latency", "kernel2_path", "kernel2_latency",
        "fused_kernel_path", "fused_kernel_latency", "slow_down_ratio",
    ],
    "graph_stats": ["graph_id", "num_nodes_before_fusion", "num_nodes_after_fusion"],
    "persistent_red_perf": [
        "kernel1_name", "kernel2_name", "kernel1_latency", "kernel2_latency",
        "size_hints", "reduction_hint", "speedup",
    ],
    "fusion_failure_due_to_indexing_mismatch": [
        "pre_grad_graph_id", "post_grad_graph_id", "node1_name", "node2_name",
        "node1_debug_str", "node2_debug_str", "common_buffer_names", "failure_reason",
    ],
    "kernel_metadata": [
        "kernel_name", "kernel_path", "kernel_category", "size_hints", "reduction_hint",
        "line_of_code", "num_load", "num_store", "num_for_loop", "num_atomic_add", "num_args",
        "xnumel", "ynumel", "rnumel", "kernel_args_num_gb",
    ],
}  # fmt: skip

PROBE = MetricTable.register_table("test_probe", ["name", "latency", "note"])


@pytest.fixture
def out_dir(tmp_path: Path) -> Iterator[Path]:
    """Tables written to tmp_path, run name 'bert', nothing enabled; restored afterwards."""
    with config.patch(tables_dir=str(tmp_path), metric_tables="", run_name="bert"):
        yield tmp_path
    for table in tables.REGISTERED_METRIC_TABLES.values():
        table.close()


def probe_file(directory: Path) -> Path:
    return directory / "metric_table_test_probe.csv"


def test_seed_tables_are_registered_with_their_columns() -> None:
    for name, columns in SEED_TABLES.items():
        assert get_metric_table(name).column_names == columns
        assert tables.REGISTERED_METRIC_TABLES[name] is get_metric_table(name)


def test_registering_again_returns_the_same_table_or_refuses_other_columns() -> None:
    assert MetricTable.register_table("test_probe", ["name", "latency", "note"]) is PROBE
    with pytest.raises(ValueError, match=r"already registered with columns \['name', 'latency'"):
        MetricTable.register_table("test_probe", ["name"])


@pytest.mark.parametrize(
    ("name", "columns", "message"),
    [
        ("bad name", ["a"], "metric table names are letters"),
        ("../x", ["a"], "metric table names are letters"),
        ("t1", [], "one or more non-empty str column names"),
        ("t1", ["a", ""], "one or more non-empty str column names"),
        ("t1", ["a", "a"], r"duplicate column names \['a'\]"),
        ("t1", ["model_name"], r"duplicate column names \['model_name'\]"),
    ],
)
def test_bad_registrations(name: str, columns: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricTable.register_table(name, columns)
    assert name not in tables.REGISTERED_METRIC_TABLES


def test_columns_given_as_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="column_names must be a list of str"):
        MetricTable.register_table("t2", "abc")


def test_unknown_table_lookup_lists_registered_tables() -> None:
    with pytest.raises(
        ValueError, match=r"'nope' is not registered; registered tables: \[.*'graph_stats'"
    ):
        get_metric_table("nope")


def test_enabling_by_config(out_dir: Path) -> None:
    assert tables.enabled_metric_tables() == frozenset()
    config.metric_tables = " test_probe , graph_stats,, "
    assert tables.enabled_metric_tables() == {"test_probe", "graph_stats"}
    assert tables.is_metric_table_enabled("graph_stats")
    assert not tables.is_metric_table_enabled("slow_fusion")
    config.metric_tables = ""
    assert not tables.is_metric_table_enabled("graph_stats")


def test_unknown_name_in_config_is_rejected_and_not_kept(out_dir: Path) -> None:
    config.metric_tables = "graph_stats"
    with pytest.raises(
        ValueError, match=r"not registered: \['grpah_stats'\]; registered tables: \["
    ):
        config.metric_tables = "grpah_stats"
    assert config.metric_tables == "graph_stats"
    assert tables.enabled_metric_tables() == {"graph_stats"}


def test_environment_variable_is_read_by_reload(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPSCOPE_METRIC_TABLES", "slow_fusion")
    monkeypatch.setenv("STEPSCOPE_TABLES_DIR", str(out_dir / "env"))
    monkeypatch.setenv("STEPSCOPE_RUN_NAME", "from-env")
    config.reload_from_env()
    assert tables.enabled_metric_tables() == {"slow_fusion"}
    assert get_metric_table("slow_fusion").output_path() == out_dir / "env" / (
        "metric_table_slow_fusion.csv"
    )
    assert config.run_name == "from-env"


def run_python(code: str, env_tables: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "STEPSCOPE_METRIC_TABLES": env_tables}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_environment_may_name_tables_the_program_registers_later(tmp_path: Path) -> None:
    code = (
        "from stepscope.tables import MetricTable\n"
        "t = MetricTable.register_table('mine', ['a'])\n"
        "t.add_row(lambda: {'a': 1.5})\n"
    )
    proc = run_python(code, "mine", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "metric_table_mine.csv").read_bytes() == b"model_name,a\n,1.500000\n"


def test_environment_typo_fails_at_first_use_even_of_a_disabled_table(tmp_path: Path) -> None:
    code = (
        "import stepscope.tables as t\n"
        "calls = []\n"
        "t.get_metric_table('graph_stats').add_row(lambda: calls.append(1))\n"
    )
    proc = run_python(code, "kernel_metadta", tmp_path)
    assert proc.returncode == 1
    assert (
        "ValueError: metric tables 'kernel_metadta' (from configuration) names metric tables"
        in (proc.stderr)
    )
    assert "registered tables: ['fusion_failure_due_to_indexing_mismatch', 'graph_stats'" in (
        proc.stderr
    )


def test_disabled_table_never_calls_row_fn(out_dir: Path) -> None:
    def row_fn() -> dict[str, object]:
        raise AssertionError("row_fn called for a disabled table")

    before = PROBE.num_rows_added
    PROBE.add_row(row_fn)  # type: ignore[arg-type]
    config.metric_tables = "graph_stats"  # another table enabled: this one still is not
    PROBE.add_row(row_fn)  # type: ignore[arg-type]
    assert PROBE.num_rows_added == before
    assert list(out_dir.iterdir()) == []


def test_csv_byte_layout(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    before = PROBE.num_rows_added
    PROBE.add_row(lambda: {"name": "conv1", "latency": 1.0 / 3.0, "note": None})
    PROBE.add_row(lambda: {"note": 'says "hi", twice', "latency": 2, "name": "fc"})
    config.run_name = None
    PROBE.add_row(lambda: {"name": "a\nb", "latency": True, "note": ""})
    assert PROBE.num_rows_added == before + 3
    assert probe_file(out_dir).read_bytes() == (
        b"model_name,name,latency,note\n"
        b"bert,conv1,0.333333,\n"
        b'bert,fc,2,"says ""hi"", twice"\n'
        b',"a\nb",True,\n'
    )


def test_row_keys_must_match_columns(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    with pytest.raises(
        ValueError,
        match=r"does not match its columns: missing \['latency'\], extra \['latncy'\]; "
        r"the columns are \['name', 'latency', 'note'\]",
    ):
        PROBE.add_row(lambda: {"name": "x", "latncy": 1.0, "note": None})
    with pytest.raises(ValueError, match=r"missing \['note'\], extra \[\]"):
        PROBE.add_row(lambda: {"name": "x", "latency": 1.0})
    with pytest.raises(TypeError, match="row_fn must return a dict"):
        PROBE.add_row(lambda: [("name", "x")])  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"column 'note': cells must be str, int, float or None"):
        PROBE.add_row(lambda: {"name": "x", "latency": 1.0, "note": [1]})  # type: ignore[dict-item]
    assert not probe_file(out_dir).exists() or probe_file(out_dir).read_bytes().count(b"\n") == 1


def test_purge_starts_enabled_tables_afresh(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    PROBE.add_row(lambda: {"name": "old", "latency": 1.0, "note": None})
    other = out_dir / "metric_table_graph_stats.csv"
    other.write_bytes(
        b"model_name,graph_id,num_nodes_before_fusion,num_nodes_after_fusion\nx,1,2,3\n"
    )
    tables.purge_old_log_files()
    assert probe_file(out_dir).read_bytes() == b"model_name,name,latency,note\n"
    assert other.read_bytes().endswith(b"x,1,2,3\n")  # graph_stats is not enabled
    PROBE.add_row(lambda: {"name": "new", "latency": 2.0, "note": None})
    assert probe_file(out_dir).read_bytes() == (
        b"model_name,name,latency,note\nbert,new,2.000000,\n"
    )
    assert [p.name for p in out_dir.iterdir() if p.name.startswith(".")] == []


def test_existing_file_with_other_columns_is_refused(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    probe_file(out_dir).write_bytes(b"model_name,other\nx,1\n")
    with pytest.raises(
        ValueError, match=r"exists with header 'model_name,other'.*purge_old_log_files"
    ):
        PROBE.add_row(lambda: {"name": "n", "latency": 1.0, "note": None})
    assert probe_file(out_dir).read_bytes() == b"model_name,other\nx,1\n"


def test_file_removed_or_replaced_while_open_is_reopened(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    PROBE.add_row(lambda: {"name": "one", "latency": 1.0, "note": None})
    probe_file(out_dir).unlink()
    PROBE.add_row(lambda: {"name": "two", "latency": 2.0, "note": None})
    assert probe_file(out_dir).read_bytes() == (
        b"model_name,name,latency,note\nbert,two,2.000000,\n"
    )


def test_changing_tables_dir_moves_the_output(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    PROBE.add_row(lambda: {"name": "a", "latency": 1.0, "note": None})
    config.tables_dir = str(out_dir / "nested" / "dir")
    PROBE.add_row(lambda: {"name": "b", "latency": 1.0, "note": None})
    assert probe_file(out_dir).read_bytes().endswith(b"bert,a,1.000000,\n")
    assert probe_file(out_dir / "nested" / "dir").read_bytes().endswith(b"bert,b,1.000000,\n")


def test_write_errors_are_counted_not_raised_unless_strict(
    out_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = out_dir / "blocker"
    blocker.write_text("a file where a directory should be")
    config.metric_tables = "test_probe"
    config.tables_dir = str(blocker / "sub")
    assert PROBE.num_write_errors == 0
    PROBE.add_row(lambda: {"name": "a", "latency": 1.0, "note": None})
    PROBE.add_row(lambda: {"name": "b", "latency": 1.0, "note": None})
    assert PROBE.num_write_errors == 2
    assert sum("cannot write metric table 'test_probe'" in r.message for r in caplog.records) == 1
    with config.patch(strict=True), pytest.raises(OSError):
        PROBE.add_row(lambda: {"name": "c", "latency": 1.0, "note": None})


def check_table_file(path: Path, expected_rows: int) -> list[list[str]]:
    """Header exactly once, first; every line a complete row."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["model_name", "name", "latency", "note"]
    body = rows[1:]
    assert len(body) == expected_rows
    assert all(len(r) == 4 and r[1] != "name" for r in body)
    return body


def test_threads_append_whole_lines(out_dir: Path) -> None:
    config.metric_tables = "test_probe"
    payload = "x" * 3000

    def worker(i: int) -> None:
        for j in range(150):

            def row(j: int = j) -> dict[str, str | float]:
                return {"name": f"t{i}-{j}", "latency": float(j), "note": payload}

            PROBE.add_row(row)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    body = check_table_file(probe_file(out_dir), 900)
    assert all(r[3] == payload for r in body)
    assert sorted(r[1] for r in body) == sorted(f"t{i}-{j}" for i in range(6) for j in range(150))


def _process_writer(directory: str, index: int, barrier: Any) -> None:
    with config.patch(tables_dir=directory, metric_tables="test_probe", run_name=f"p{index}"):
        barrier.wait()  # every process opens the (missing) file at the same moment
        for j in range(200):

            def row(j: int = j) -> dict[str, str | float]:
                return {"name": f"{index}-{j}", "latency": j * 0.5, "note": "y" * 5000}

            PROBE.add_row(row)


def test_processes_append_whole_lines_and_one_header(out_dir: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    processes = 4
    barrier = ctx.Barrier(processes)
    procs = [
        ctx.Process(target=_process_writer, args=(str(out_dir), i, barrier))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * processes
    body = check_table_file(probe_file(out_dir), processes * 200)
    assert {r[0] for r in body} == {f"p{i}" for i in range(processes)}
    assert sorted(r[1] for r in body) == sorted(
        f"{i}-{j}" for i in range(processes) for j in range(200)
    )
    assert all(r[3] == "y" * 5000 for r in body)


def test_header_is_decided_under_the_file_lock(out_dir: Path) -> None:
    import fcntl
    import time

    # An empty file exists and another process holds its lock: every writer must wait, and
    # only the first one to get the lock may write the header.
    path = probe_file(out_dir)
    path.touch()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    with open(path, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        procs = [
            ctx.Process(target=_process_writer, args=(str(out_dir), i, barrier)) for i in range(3)
        ]
        for p in procs:
            p.start()
        barrier.wait()
        time.sleep(0.2)  # let the writers reach the lock
        assert path.read_bytes() == b""
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        for p in procs:
            p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    check_table_file(path, 600)


def _write_one(directory: str) -> None:
    with config.patch(tables_dir=directory, metric_tables="test_probe", run_name="child"):
        PROBE.add_row(lambda: {"name": "from-child", "latency": 1.0, "note": None})


def test_a_child_forked_while_a_row_is_being_written_can_write(out_dir: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    with PROBE._lock:  # as if another thread were inside add_row at fork time
        child = ctx.Process(target=_write_one, args=(str(out_dir),))
        child.start()
    child.join(30)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert probe_file(out_dir).read_bytes().endswith(b"child,from-child,1.000000,\n")
