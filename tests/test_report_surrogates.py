"""A trace whose operator name holds an unpaired surrogate (JSON's ``\\ud800`` escape reads back
as one): ``report --json``, ``--markdown``, ``--parquet`` and ``diff --json`` write valid UTF-8,
the character replaced by U+FFFD and counted (in the JSON's ``text_replaced`` and on stderr),
as the terminal and the HTML page already did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

NAME = "op\ud800x"
"""An operator name with a lone high surrogate."""


def hostile_trace(path: Path) -> Path:
    events = []
    for step in (1, 2):
        start = step * 100
        events.append(
            {"ph": "X", "name": f"ProfilerStep#{step}", "ts": start, "dur": 100, "pid": 1,
             "tid": 1, "cat": "user_annotation"}
        )  # fmt: skip
        events.append(
            {"ph": "X", "name": NAME, "ts": start + 10, "dur": 50, "pid": 1, "tid": 1,
             "cat": "cpu_op"}
        )  # fmt: skip
    text = json.dumps({"traceEvents": events})  # ensure_ascii: the surrogate is an escape
    assert "\\ud800" in text
    path.write_text(text)
    return path


def strict_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_bytes().decode("utf-8"))  # strict UTF-8
    return data


def test_report_outputs_replace_and_count_a_lone_surrogate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = hostile_trace(tmp_path / "t.pt.trace.json")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["report", str(trace), "--json", str(out), "--markdown", str(md)]) == 0
    err = capsys.readouterr().err
    data = strict_json(out)
    names = [op["name"] for op in data["combined"]["operators"]]
    assert names == ["op\ufffdx"]
    # the name is in the combined view and in the one file's: two characters replaced
    assert data["text_replaced"] == 2
    assert "JSON -> " in err and "(2 unpaired surrogates replaced by U+FFFD)" in err
    assert "op\ufffdx" in md.read_bytes().decode("utf-8")
    assert "(1 unpaired surrogate replaced by U+FFFD)" in err


def test_a_clean_report_counts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = hostile_trace(tmp_path / "t.pt.trace.json")
    trace.write_text(trace.read_text().replace("\\ud800", "_"))
    out = tmp_path / "r.json"
    assert main(["report", str(trace), "--json", str(out)]) == 0
    assert strict_json(out)["text_replaced"] == 0
    assert "replaced" not in capsys.readouterr().err


def test_parquet_and_diff_replace_and_count_a_lone_surrogate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = hostile_trace(tmp_path / "t.pt.trace.json")
    out = tmp_path / "d.json"
    assert main(["diff", str(trace), str(trace), "--json", str(out)]) == 0
    data = strict_json(out)
    assert data["text_replaced"] >= 1 and "\ufffd" in json.dumps(data, ensure_ascii=False)
    assert "unpaired surrogate" in capsys.readouterr().err
    pq = pytest.importorskip("pyarrow.parquet")
    tables = tmp_path / "pq"
    assert main(["report", str(trace), "--parquet", str(tables)]) == 0
    assert "(1 unpaired surrogate replaced by U+FFFD)" in capsys.readouterr().err
    ops = pq.read_table(tables / "ops.parquet").to_pylist()
    assert [op["name"] for op in ops] == ["op\ufffdx"]
