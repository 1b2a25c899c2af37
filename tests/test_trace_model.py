"""The columnar trace model: interning, labels, read-only tables, merging."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope._ext import native
from stepscope.trace import Trace, TraceBuilder, remap
from stepscope.trace.layouts import LABEL_BASE, python_ids_ref


def small_trace(base: int = 1_000_000_000) -> Trace:
    b = TraceBuilder(base_time_ns=base)
    b.process_name(7, "worker")
    b.thread_name(7, 8, "main")
    b.span("step", "user_annotation", 7, 8, 100, 50, {"n": 1})
    b.span("op", "cpu_op", 7, 8, 110, 20)
    b.instant("mark", "", 7, "Spans", 120, "g")
    b.counter("memory", 7, 130, {"allocated": 10, "reserved": 20})
    b.flow("ac2g", "ac2g", 7, 8, 110, 3, "s")
    b.flow("ac2g", "ac2g", 0, 9, 140, 3, "f", "e")
    main = b.frame("main", "a.py", 1)
    leaf = b.frame("leaf", "a.py", 9)
    b.sample(7, 8, 125, b.stack([main, leaf]))
    return b.build()


def test_names_are_interned_once() -> None:
    b = TraceBuilder(base_time_ns=0)
    for i in range(1000):
        b.span("same", "cat", 1, 1, i, 1)
    trace = b.build()
    assert len(trace.spans) == 1000
    assert trace.strings.count("same") == 1
    assert set(trace.spans["name"]) == {trace.strings.index("same")}


def test_a_counter_series_in_one_go_equals_its_points_one_by_one() -> None:
    points = [(100, 1.0), (150, 3.5), (170, 2.0)]
    one_by_one, bulk = TraceBuilder(base_time_ns=0), TraceBuilder(base_time_ns=0)
    for ts, value in points:
        one_by_one.counter("Memory cpu", 7, ts, {"Total Allocated": value})
    bulk.counter_series("Memory cpu", 7, "Total Allocated", points)
    assert list(bulk.build().iter_counter_events()) == list(
        one_by_one.build().iter_counter_events()
    )


def test_columns_are_read_only_arrays() -> None:
    trace = small_trace()
    with pytest.raises(TypeError):
        trace.spans["start_ns"][0] = 5  # type: ignore[index]
    assert trace.spans["start_ns"].format == "q"
    with pytest.raises(KeyError, match="columns are"):
        trace.spans["nope"]


def test_decoding_gives_back_what_was_added() -> None:
    trace = small_trace()
    spans = list(trace.iter_spans())
    assert spans[0].name == "step" and spans[0].end_ns == 150 and spans[0].args == {"n": 1}
    assert spans[1].args is None
    (inst,) = trace.iter_instants()
    assert inst.tid == "Spans" and inst.scope == "g" and inst.cat == ""
    (counter,) = trace.iter_counter_events()
    assert counter.values == {"allocated": 10.0, "reserved": 20.0}
    assert [f.phase for f in trace.iter_flows()] == ["s", "f"]
    assert [s.stack for s in trace.iter_samples()] == [("main", "leaf")]
    assert trace.process_names() == {7: "worker"}
    assert trace.thread_names() == {(7, 8): "main"}
    assert trace.event_count() == 2 + 1 + 1 + 2 + 2


def test_string_labels_are_encoded_above_label_base() -> None:
    b = TraceBuilder(base_time_ns=0)
    assert b.encode_label("Spans") >= LABEL_BASE
    assert b.encode_label(123) == 123
    with pytest.raises(TypeError, match="pid/tid must be int or str"):
        b.encode_label(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out of range"):
        b.encode_label(LABEL_BASE)


def test_bad_arguments_are_rejected_clearly() -> None:
    b = TraceBuilder(base_time_ns=0)
    with pytest.raises(ValueError, match="scope"):
        b.instant("x", "", 1, 1, 0, scope="q")
    with pytest.raises(ValueError, match="phase"):
        b.flow("x", "", 1, 1, 0, 1, "x")
    with pytest.raises(ValueError, match="at least one series"):
        b.counter("x", 1, 0, {})
    with pytest.raises(TypeError, match="args must be a mapping"):
        b.span("x", "", 1, 1, 0, 1, args=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be str"):
        b.intern(5)  # type: ignore[arg-type]


def test_add_trace_shifts_times_to_the_new_base() -> None:
    a = small_trace(base=1_000_000_000)
    merged = TraceBuilder(base_time_ns=999_999_000)
    merged.span("own", "", 1, 1, 0, 5)
    merged.add_trace(a)
    trace = merged.build()
    spans = {s.name: s for s in trace.iter_spans()}
    assert spans["step"].start_ns == 100 + 1000
    assert [s.ts_ns for s in trace.iter_samples()] == [125 + 1000]
    assert [s.stack for s in trace.iter_samples()] == [("main", "leaf")]
    assert next(trace.iter_instants()).tid == "Spans"
    assert len(trace.meta) == 2


def test_extend_spans_appends_in_bulk() -> None:
    b = TraceBuilder(base_time_ns=0)
    name, cat = b.intern("f"), b.intern("python_function")
    ref = b.add_args({"Python id": 1})
    b.extend_spans([name, name], [cat, cat], [1, 1], [2, 2], [0, 10], [5, 5], [ref, -1])
    trace = b.build()
    assert [s.args for s in trace.iter_spans()] == [{"Python id": 1}, None]
    with pytest.raises(ValueError, match="same length"):
        TraceBuilder(base_time_ns=0).extend_spans([1], [], [], [], [], [])


def test_bulk_rows_filled_in_place_with_python_ids_and_noted_tracks() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("before", "cpu_op", 1, 5, 0, 9)
    first_span, first_row = b.span_rows, b.python_ids_rows
    fill = {"cat": b.intern("python_function"), "pid": 1}
    with b.grown("spans", 3, fill) as spans, b.grown("python_ids", 3) as ids:
        spans["name"][:] = array("I", [b.intern("f")]) * 3
        spans["tid"][:] = array("q", [7, 7, 8])
        spans["start_ns"][:] = array("q", [10, 11, 20])
        spans["dur_ns"][:] = array("q", [5, 1, 2])
        spans["args"][:] = array("i", [python_ids_ref(first_row + k) for k in range(3)])
        ids["id"][:] = array("q", [1, 2, 3])
        ids["parent"][:] = array("q", [0, 1, 0])
    b.note_span_tracks(first_span, first_span + 3, {(1, 7), (1, 8)})
    b.span("after", "cpu_op", 2, 9, 30, 1)
    assert b.span_tracks() == {(1, 5), (1, 7), (1, 8), (2, 9)}
    trace = b.build()
    assert [s.args for s in trace.iter_spans()] == [
        None,
        {"Python id": 1, "Python parent id": None},
        {"Python id": 2, "Python parent id": 1},
        {"Python id": 3, "Python parent id": None},
        None,
    ]
    assert [s.tid for s in trace.iter_spans()] == [5, 7, 7, 8, 9]
    # merged into another trace, the ids follow their spans
    merged = TraceBuilder(base_time_ns=0)
    merged.add_trace(trace)
    merged.add_trace(trace)
    again = merged.build()
    assert [s.args for s in again.iter_spans()] == 2 * [s.args for s in trace.iter_spans()]


@pytest.mark.native
@pytest.mark.skipif(native() is None, reason="C extension not built")
@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(0, 9), max_size=20),
    labels=st.lists(
        st.integers(-(2**40), 2**40) | st.integers(0, 9).map(LABEL_BASE.__add__), max_size=20
    ),
    # times and offset whose sums fit in int64 (an overflow is an error on both sides: below)
    times=st.lists(st.integers(-(2**61), 2**61), max_size=20),
    refs=st.lists(st.integers(-(2**20), 2**20), max_size=20),  # -2 - row: a python_ids row
    offset=st.integers(-(2**61), 2**61),
    ref_offset=st.integers(0, 2**20),
)
def test_c_column_remap_matches_the_python_twin(
    ids: list[int],
    labels: list[int],
    times: list[int],
    refs: list[int],
    offset: int,
    ref_offset: int,
) -> None:
    mod = native()
    assert mod is not None
    table = array("I", [7 * k + 3 for k in range(10)])
    cases = [
        (array("I", ids), remap.IDS, table, 0),
        (array("q", labels), remap.LABELS, table, 0),
        (array("q", times), remap.TIMES, None, offset),
        (array("i", refs), remap.REFS, None, ref_offset),
    ]
    for values, mode, mapping, by in cases:
        twin = remap.remapped_python(values, mode, mapping, by)
        assert mod.remap_column(values, mode, mapping, by) == twin.tobytes()
    with pytest.raises(IndexError):
        mod.remap_column(array("I", [10]), remap.IDS, table, 0)
    with pytest.raises(OverflowError):
        mod.remap_column(array("q", [2**62]), remap.TIMES, None, 2**62)
