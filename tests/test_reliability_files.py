"""Append-only files end on a whole record after a full disk or a kill; spill files are private.

Issue 13, points 3, 5 and 12.  The full-disk tests fill a real 1 MiB tmpfs.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope import tables
from stepscope.config import config
from stepscope.metrics import CsvExporter, JsonlExporter, Pipeline
from stepscope.metrics.spill import SpillFile, default_spill_dir, read_spill
from stepscope.steps import set_step
from stepscope.tables import MetricTable
from tests.reliability_helpers import fill, small_tmpfs

pytestmark = pytest.mark.implementation_independent

TABLE = MetricTable.register_table("test_reliability", ["name", "note"])


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk") as mounted:
        yield mounted


def pipeline_for(spill_dir: Path) -> Pipeline:
    from stepscope.metrics import RetryPolicy

    return Pipeline(
        interval_s=60,
        handle_sigterm=False,
        spill_dir=spill_dir,
        retry=RetryPolicy(attempts=1, initial_backoff_s=0, max_backoff_s=0),
    )


def record_steps(p: Pipeline, first: int, n: int, width: int = 200) -> None:
    loss = p.scalar("loss")
    for step in range(first, first + n):
        set_step(step)
        loss.bind(tag="x" * width).record(float(step))
    set_step(first + n)


def whole_json_lines(path: Path, kind: str | None = "scalar") -> list[dict[str, object]]:
    """The file's lines (of ``kind``), after checking it ends on a whole line."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-80:]
    rows = [json.loads(line) for line in data.splitlines()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


def check_accounting(p: Pipeline, name: str) -> dict[str, Any]:
    acc = p.accounting()[name]
    assert acc["exported"] + acc["spilled"] + acc["dropped"] == acc["produced"], acc
    return acc


def test_jsonl_on_a_full_disk_never_glues_lines(disk: Path, tmp_path: Path) -> None:
    p = pipeline_for(tmp_path / "spill")
    out = disk / "m.jsonl"
    p.add_exporter(JsonlExporter(out))
    record_steps(p, 0, 3)
    p.flush(10)
    assert len(whole_json_lines(out)) == 3
    filler = fill(disk, leave=1000)
    record_steps(p, 3, 40)  # about 10 kB: does not fit
    p.flush(10)
    assert len(whole_json_lines(out)) == 3  # the failed batch was cut back
    acc = check_accounting(p, "jsonl")
    assert acc["exported"] == 3 and acc["spilled"] == 40
    filler.unlink()
    record_steps(p, 43, 2)
    p.flush(10)
    rows = whole_json_lines(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 43, 44]
    assert read_spill(tmp_path / "spill" / f"jsonl-{os.getpid()}.jsonl")
    p.shutdown(5)
    check_accounting(p, "jsonl")


def test_csv_on_a_full_disk_ends_on_a_whole_row(disk: Path, tmp_path: Path) -> None:
    p = pipeline_for(disk / "spill")  # the spill file is on the full disk too
    out = disk / "m.csv"
    p.add_exporter(CsvExporter(out))
    record_steps(p, 0, 2)
    p.flush(10)
    fill(disk, leave=500)
    record_steps(p, 2, 40)
    p.flush(10)
    data = out.read_bytes()
    assert data.endswith(b"\r\n")
    rows = list(csv.reader(io.StringIO(data.decode())))
    assert [r[1] for r in rows[1:] if r[1] == "scalar"] == ["scalar"] * 2
    acc = check_accounting(p, "csv")
    assert acc["exported"] == 2 and acc["dropped_by_reason"].get("spill_error") == 40
    spill = disk / "spill" / f"csv-{os.getpid()}.jsonl"
    assert not spill.exists() or spill.read_bytes() == b""
    p.shutdown(5)


def test_spill_file_on_a_full_disk_stays_readable(disk: Path) -> None:
    spill = SpillFile(disk / "spill", "jsonl", 1 << 30)
    assert spill.write([{"n": 0}]) is None
    fill(disk, leave=200)
    assert spill.write([{"n": i, "pad": "p" * 100} for i in range(1, 50)]) == "spill_error"
    assert read_spill(spill.path) == [{"n": 0}]
    assert spill.path.read_bytes().endswith(b"\n")


def test_metric_table_on_a_full_disk_ends_on_a_whole_row(disk: Path) -> None:
    with config.patch(tables_dir=str(disk), metric_tables="test_reliability", run_name="r"):
        try:
            TABLE.add_row(lambda: {"name": "first", "note": "ok"})
            fill(disk, leave=100)
            for i in range(20):

                def row(i: int = i) -> dict[str, str]:
                    return {"name": f"row{i}", "note": "n" * 300}

                TABLE.add_row(row)
            assert TABLE.num_write_errors > 0
            data = (disk / "metric_table_test_reliability.csv").read_bytes()
            assert data.endswith(b"\n")
            assert data.splitlines()[-1].startswith(b"r,")
        finally:
            TABLE.close()


KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from stepscope.metrics import JsonlExporter, Pipeline
    from stepscope.steps import set_step

    p = Pipeline(interval_s=0.001, handle_sigterm=False, spill_dir=sys.argv[2])
    p.add_exporter(JsonlExporter(sys.argv[1], max_bytes=1 << 40))
    loss = p.scalar("loss")
    print("ready", flush=True)
    step = 0
    while True:
        for _ in range(2000):
            set_step(step)
            loss.bind(pad="x" * 500).record(1.0)
            step += 1
    """
)


@pytest.mark.slow
def test_sigkill_mid_export_leaves_whole_lines_after_reopen(tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    for attempt in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_WRITER, str(out), str(tmp_path / "spill")],
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(0.3 + 0.07 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # the next writer (a restarted job) repairs the tail before appending
        exporter = JsonlExporter(out, max_bytes=1 << 40)
        exporter.file.write('{"kind":"marker"}\n')
        exporter.close()
        rows = whole_json_lines(out, kind=None)
        assert rows[-1] == {"kind": "marker"}
    # about half the kills tear the last line; make sure the repair is exercised either way
    with open(out, "ab") as fh:
        fh.write(b'{"kind":"sca')
    exporter = JsonlExporter(out, max_bytes=1 << 40)
    exporter.file.write('{"kind":"marker"}\n')
    exporter.close()
    assert whole_json_lines(out, kind=None)[-2:] == [{"kind": "marker"}, {"kind": "marker"}]
    # a reader skips a torn tail and says so
    with open(out, "ab") as fh:
        fh.write(b'{"kind":"scal')
    found = read_spill(out)
    assert found.torn_bytes == len(b'{"kind":"scal') and found[-1] == {"kind": "marker"}


def test_spill_files_are_private_and_refuse_links(tmp_path: Path) -> None:
    directory = default_spill_dir()
    spill = SpillFile(directory, f"privacy-test-{os.getpid()}", 1 << 20)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    spill.path.parent.mkdir(mode=0o700, exist_ok=True)
    spill.path.unlink(missing_ok=True)
    os.symlink(victim, spill.path)
    try:
        assert spill.write([{"a": 1}]) == "spill_error"
        assert victim.read_text() == "precious\n"
    finally:
        spill.path.unlink()
    assert spill.write([{"a": 1}]) is None
    try:
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(spill.path).st_mode) == 0o600
    finally:
        spill.path.unlink()


def test_a_shared_default_spill_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    directory = default_spill_dir()
    assert directory.parent == tmp_path
    directory.mkdir(mode=0o777)
    os.chmod(directory, 0o777)  # world-writable: someone else could plant links in it
    spill = SpillFile(directory, "jsonl", 1 << 20)
    assert spill.write([{"a": 1}]) == "spill_error"
    assert list(directory.iterdir()) == []
    os.rmdir(directory)
    os.symlink(tmp_path / "elsewhere", directory)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    assert spill.write([{"a": 1}]) == "spill_error"
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_csv_cells_with_carriage_returns_and_surrogates(tmp_path: Path) -> None:
    p = Pipeline(interval_s=60, handle_sigterm=False, spill_dir=tmp_path / "spill")
    out = tmp_path / "m.csv"
    p.add_exporter(CsvExporter(out))
    p.gauge("g").bind(a="1;b=2", path="x\ry").set(1)
    p.gauge("g").bind(a="1", b="2").set(2)
    p.gauge("g").bind(path="caf\udce9").set(3)
    p.flush(10)
    p.shutdown(5)
    with open(out, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    labels = {float(r["value"]): json.loads(r["labels"]) for r in rows if r["name"] == "g"}
    assert labels == {
        1.0: {"a": "1;b=2", "path": "x\ry"},
        2.0: {"a": "1", "b": "2"},
        3.0: {"path": "caf\udce9"},  # kept exactly, as a JSON escape
    }


def test_metric_table_cells_with_carriage_returns_and_surrogates(tmp_path: Path) -> None:
    with config.patch(tables_dir=str(tmp_path), metric_tables="test_reliability", run_name="r"):
        try:
            TABLE.add_row(lambda: {"name": "a\rb", "note": "caf\udce9"})
            TABLE.add_row(lambda: {"name": "plain", "note": ""})
        finally:
            TABLE.close()
    with open(tmp_path / "metric_table_test_reliability.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows == [
        ["model_name", "name", "note"],
        ["r", "a\rb", "caf\ufffd"],  # as the trace writer replaces it
        ["r", "plain", ""],
    ]
    assert tables.format_csv_row(["x\ry"]) == b'"x\ry"\n'
