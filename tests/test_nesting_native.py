"""The C ``nest_spans`` (``_csrc/span_nesting.c``) gives the same parents, self times and fold
flags as its twin ``nest_spans_python``: on every shared real trace, on hand-made tracks (checked
against values worked out by hand, under both) and on random spans (hypothesis), where self times
are also held to each track's covered time, computed here from the spans."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope._ext import native
from stepscope.trace import read_chrome_trace
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.nesting import Nesting, nest_spans, nest_spans_python
from tests.analysis_helpers import SHARED

pytestmark = pytest.mark.native

needs_c = pytest.mark.skipif(native() is None, reason="the C extension is not in use")

I64_MIN, I64_MAX = -(2**63), 2**63 - 1

Row = tuple[str, int | str, int | str, int, int]
"""name, pid, tid, start_ns, dur_ns."""


def trace_of(rows: list[Row]) -> Trace:
    b = TraceBuilder()
    for name, pid, tid, start, dur in rows:
        b.span(name, "cpu_op", pid, tid, start, dur)
    return b.build()


def nest(trace: Trace, implementation: str) -> Nesting:
    """``nest_spans`` (the C part: the fixture skips without it) or the twin."""
    return nest_spans_python(trace) if implementation == "python" else nest_spans(trace)


def outcome(trace: Trace, fn: object) -> tuple[list[int], list[int], list[int]] | str:
    """The three arrays as lists, or the name of the error raised."""
    assert callable(fn)
    try:
        n = fn(trace)
    except OverflowError:
        return "OverflowError"
    return n.parent.tolist(), n.self_ns.tolist(), n.folded.tolist()


def assert_twins_agree(trace: Trace) -> None:
    assert outcome(trace, nest_spans) == outcome(trace, nest_spans_python)


SHARED_TRACES = sorted(p.name for p in SHARED.glob("*.json.gz")) if SHARED.is_dir() else []


@needs_c
@pytest.mark.skipif(not SHARED_TRACES, reason="shared GPU traces not present")
@pytest.mark.parametrize("name", SHARED_TRACES)
def test_real_traces_nest_alike(name: str, tmp_path: Path) -> None:
    copy = tmp_path / name
    shutil.copyfile(SHARED / name, copy)
    try:
        trace = read_chrome_trace(copy)
    except ValueError as exc:  # the execution-trace file is not a Chrome trace
        assert "not a Chrome trace" in str(exc)
        pytest.skip(f"{name} is not a Chrome trace")
    c, twin = nest_spans(trace), nest_spans_python(trace)
    assert c.parent == twin.parent
    assert c.self_ns == twin.self_ns
    assert c.folded == twin.folded


CASES: dict[str, tuple[list[Row], list[int], list[int], list[int]]] = {
    # name: rows, expected parents, self times, fold flags
    "nested and siblings": (
        [("a", 1, 1, 0, 100), ("b", 1, 1, 10, 20), ("c", 1, 1, 40, 30), ("d", 1, 1, 45, 5)],
        [-1, 0, 0, 2],
        [50, 20, 25, 5],
        [0, 0, 0, 0],
    ),
    "crossing (a step opened in one call, closed in the next)": (
        [("f", 1, 1, 0, 10), ("s", 1, 1, 5, 20), ("g", 1, 1, 12, 3)],
        [-1, 0, 1],
        [5, 17, 3],
        [0, 0, 0],
    ),
    "equal starts: longest first, then index": (
        [("x", 1, 1, 0, 5), ("y", 1, 1, 0, 10), ("z", 1, 1, 0, 5)],
        [1, -1, 0],
        [0, 5, 5],
        [0, 0, 0],
    ),
    "zero durations": (
        [("a", 1, 1, 0, 0), ("b", 1, 1, 0, 10), ("c", 1, 1, 10, 0), ("d", 1, 1, 5, 0)],
        [1, -1, -1, 1],
        [0, 10, 0, 0],
        [0, 0, 0, 0],
    ),
    "several tracks, string labels": (
        [("a", 1, 1, 0, 10), ("a", 1, 2, 2, 4), ("b", "gpu", "s7", 1, 8), ("b", "gpu", "s7", 3, 2)],
        [-1, -1, -1, 2],
        [10, 4, 6, 2],
        [0, 0, 0, 1],
    ),
    "a step outliving its parent hangs under the call that holds it": (
        [
            ("outer", 1, 1, 0, 100),
            ("Optimizer.step", 1, 1, 0, 20),
            ("ProfilerStep#2", 1, 1, 15, 50),
        ],
        [-1, 0, 0],
        [35, 15, 50],
        [0, 0, 0],
    ),
    "huge times (ends past int64)": (
        [("a", 1, 1, I64_MAX - 10, I64_MAX), ("b", 1, 1, I64_MAX - 4, I64_MAX)],
        [-1, 0],
        [6, I64_MAX],
        [0, 0],
    ),
    "negative times and durations": (
        [("a", 1, 1, I64_MIN, 30), ("a", 1, 1, I64_MIN + 5, -5), ("b", 1, 1, -10, -3)],
        [-1, 0, -1],
        [35, -5, -3],
        [0, 1, 0],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hand_made_tracks(case: str, implementation: str) -> None:
    rows, parents, self_ns, folded = CASES[case]
    n = nest(trace_of(rows), implementation)
    assert n.parent.tolist() == parents
    assert n.self_ns.tolist() == self_ns
    assert n.folded.tolist() == folded


def test_a_self_time_past_int64_raises_overflow(implementation: str) -> None:
    # the child's negative duration adds 2**63 to its parent's self time
    trace = trace_of([("a", 1, 1, 0, 10), ("b", 1, 1, 0, I64_MIN)])
    with pytest.raises(OverflowError):
        nest(trace, implementation)


@needs_c
def test_columns_of_unequal_length_are_refused() -> None:
    mod = native()
    assert mod is not None
    eight, four = bytes(8), bytes(4)
    with pytest.raises(ValueError, match="8 bytes and names 4 per span"):
        mod.nest_spans(eight, eight, eight, bytes(16), four, b"")
    assert mod.nest_spans(b"", b"", b"", b"", b"", b"") == (b"", b"", b"")


def covered_ns(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of [start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


small_times = st.integers(0, 60)
any_times = st.one_of(small_times, st.integers(I64_MIN, I64_MAX))
NAMES = ("a", "b", "ProfilerStep#1", "ProfilerStep#2")
PIDS: st.SearchStrategy[int | str] = st.sampled_from((1, 2, "p"))


@st.composite
def span_rows(draw: st.DrawFn, times: st.SearchStrategy[int]) -> list[Row]:
    n = draw(st.integers(0, 40))
    return [
        (
            draw(st.sampled_from(NAMES)),
            draw(PIDS),
            draw(st.sampled_from((1, -3))),
            draw(times),
            draw(times),
        )
        for _ in range(n)
    ]


@needs_c
@settings(max_examples=300, deadline=None)
@given(span_rows(small_times))
def test_random_spans_nest_alike_and_cover_each_track(rows: list[Row]) -> None:
    trace = trace_of(rows)
    c, twin = nest_spans(trace), nest_spans_python(trace)
    assert (c.parent, c.self_ns, c.folded) == (twin.parent, twin.self_ns, twin.folded)
    tracks: dict[tuple[int | str, int | str], list[int]] = {}
    for i, (_, pid, tid, _, _) in enumerate(rows):
        tracks.setdefault((pid, tid), []).append(i)
    for members in tracks.values():  # self times never overlap: they add up to the covered time
        spans = [(rows[i][3], rows[i][3] + rows[i][4]) for i in members]
        assert sum(c.self_ns[i] for i in members) == covered_ns(spans)
    for i, p in enumerate(c.parent):  # a parent is on the child's track and holds its start
        if p >= 0:
            assert rows[p][1:3] == rows[i][1:3]
            assert rows[p][3] <= rows[i][3] < rows[p][3] + rows[p][4]


@needs_c
@settings(max_examples=300, deadline=None)
@given(span_rows(any_times))
def test_random_extreme_spans_nest_alike(rows: list[Row]) -> None:
    assert_twins_agree(trace_of(rows))
