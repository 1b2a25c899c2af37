"""Property: report, diff, merge and --parquet on any hostile trace give a report or one line.

Traces mix hostile names (unpaired surrogates, control and escape characters, bidi overrides,
rich markup, 1 MB names), hostile numbers (negative, zero, 10**30, NaN, inf) and shapes (deep
stacks, zero steps, duplicate ranks).  Whatever the mix, each command either exits 0 with its
outputs whole, or exits non-zero with one line on stderr; never a traceback, an internal error,
a raw escape or surrogate on the terminal, a leftover temporary file or a half-written output.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stepscope.cli import main  # noqa: E402

pytestmark = pytest.mark.slow

HOSTILE_NAMES = [
    "\ud800",
    "a\udcffb",
    "\x1b]0;title\x07",
    "\x1b[2J\x1b[H forged",
    "\x00nul",
    "line\r\nbreak",
    "\u202eevil",
    "[/bold] not markup [red]",
    "tab\there",
    "ProfilerStep#x",
    "",
    "x" * 1_000_000,
]
HOSTILE_NUMBERS: list[Any] = [-5, 0, 1, 7, 10**30, math.nan, math.inf, -1e300, 2**63]

names = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=20))
numbers = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.integers(0, 5000))


@st.composite
def traces(draw: st.DrawFn) -> dict[str, Any]:
    """One Chrome trace: some steps (maybe none), hostile ops, maybe a deep stack and a rank."""
    events: list[dict[str, Any]] = []
    steps = draw(st.integers(0, 3))
    step_number = draw(st.sampled_from([0, 5, 10**30, 2**63]))
    for s in range(steps):
        t = s * 10_000
        dur = draw(st.one_of(st.just(9000), numbers))
        events.append(
            {"ph": "X", "name": f"ProfilerStep#{step_number + s}", "ts": t, "dur": dur}
            | {"pid": 1, "tid": 1, "cat": "user_annotation"}
        )
        for i in range(draw(st.integers(0, 3))):
            events.append(
                {"ph": "X", "name": draw(names), "ts": t + 10 + i, "dur": draw(numbers)}
                | {"pid": 1, "tid": draw(st.sampled_from([1, 2])), "cat": "cpu_op"}
            )
    if draw(st.booleans()):  # a deep stack of distinct frames
        depth = draw(st.sampled_from([50, 600]))
        events += [
            {"ph": "X", "name": f"f{d}", "ts": 1 + d, "dur": 8000 - 2 * d, "pid": 1, "tid": 1}
            | {"cat": "python_function"}
            for d in range(depth)
        ]
    trace: dict[str, Any] = {"traceEvents": events}
    if draw(st.booleans()):  # stack samples whose frames have hostile names
        frames = [draw(names) for _ in range(draw(st.integers(1, 3)))]
        trace["stackFrames"] = {
            str(i): {"name": name} | ({"parent": str(i - 1)} if i else {})
            for i, name in enumerate(frames)
        }
        trace["samples"] = [
            {"ts": 20 + i, "sf": str(len(frames) - 1), "pid": 1, "tid": 1, "weight": 1}
            for i in range(3)
        ]
    if draw(st.booleans()):
        trace["distributedInfo"] = {"rank": draw(st.sampled_from([0, 0, 1, -1, 10**30]))}
    return trace


def run(*args: str) -> tuple[int, str, str]:
    """``stepscope ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse refusing an argument
            status = int(exc.code or 0)
    return status, out.getvalue(), err.getvalue()


def check_terminal(status: int, out: str, err: str) -> None:
    """A report or one line: nothing raw reaches the terminal."""
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    for text in (out, err):
        text.encode("utf-8")  # strict: an unpaired surrogate fails here
        for raw in ("\x1b", "\x07", "\x00", "\u202e"):
            assert raw not in text
    if status != 0:
        failures = [line for line in err.splitlines() if "error:" in line]
        assert len(failures) <= 1, err
        if failures:
            assert not out or "error:" not in out


def check_outputs(out_dir: Path, status: int) -> None:
    """Every output is whole: strict JSON, a closed HTML page, a readable Parquet set."""
    leftovers = [p.name for p in out_dir.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers
    for path in out_dir.glob("*.json"):
        json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    for path in out_dir.glob("*.html"):
        assert path.read_text(encoding="utf-8").rstrip().endswith("</html>")
    parquet = out_dir / "pq"
    if parquet.exists() and any(parquet.iterdir()):
        pq = pytest.importorskip("pyarrow.parquet")
        tables = {p.name: pq.read_table(p) for p in parquet.glob("*.parquet")}
        runs = {t.column("run")[0] for t in tables.values() if len(t)}
        assert len(tables) >= 5 and len(runs) <= 1


def _no_constant(name: str) -> float:
    raise AssertionError(f"non-standard JSON constant {name} in an output")


FILE_NAME_PARTS = ["", "\x1b[2J", "\u202e", "[bold]", "\udcff", "\r", "é"]
"""Hostile parts of file names (a lone surrogate is a byte that is not UTF-8 on Linux)."""


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    a=st.lists(traces(), min_size=1, max_size=3),
    b=traces(),
    part=st.sampled_from(FILE_NAME_PARTS),
)
def test_report_diff_merge_and_parquet_give_a_report_or_one_line(
    a: list[dict[str, Any]], b: dict[str, Any], part: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs, out = root / "a", root / "out"
        runs.mkdir()
        out.mkdir()
        for i, trace in enumerate(a):
            (runs / f"host{part}_rank{i}.json").write_text(json.dumps(trace), encoding="ascii")
        other = root / f"b{part}.json"
        other.write_text(json.dumps(b), encoding="ascii")
        commands = [
            [
                "report",
                str(runs),
                "--json",
                str(out / "r.json"),
                "--html",
                str(out / "r.html"),
                "--parquet",
                str(out / "pq"),
            ],
            ["diff", str(runs), str(other), "--json", str(out / "d.json")],
            ["merge", str(runs), "-o", str(out / "m.json")],
        ]
        for command in commands:
            status, stdout, stderr = run(*command)
            check_terminal(status, stdout, stderr)
            check_outputs(out, status)
