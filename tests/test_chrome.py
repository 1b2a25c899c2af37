"""Chrome trace files: Kineto dialect writer, reader, round trips, torch interop, failures."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope._ext import native
from stepscope.jsonenc import json_bytes
from stepscope.trace import (
    ChromeTraceError,
    Trace,
    TraceBuilder,
    read_chrome_trace,
    write_chrome_trace,
)
from stepscope.trace.chrome_reader import spans_from_events_python
from stepscope.trace.chrome_writer import format_spans_python
from stepscope.trace.sampled_spans import SAMPLED_CATEGORY


def strict_load(path: Path) -> dict[str, Any]:
    """json.load that also refuses NaN/Infinity (what browsers' JSON.parse accepts)."""

    def reject(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh, parse_constant=reject)
    return doc


def sample_trace() -> Trace:
    b = TraceBuilder(base_time_ns=1_700_000_000_123_456_789)
    b.metadata["with_stack"] = 1
    b.distributed_info = {"backend": "gloo", "rank": 3, "world_size": 4}
    b.device_properties = [{"id": 0, "name": "fake"}]
    b.process_name(11, "python")
    b.thread_name(11, 12, "thread 12 (python)")
    b.span("ProfilerStep#0", "user_annotation", 11, 12, 1000, 900_000, {"x": [1, 2]})
    b.span("aten::add", "cpu_op", 11, 12, 2000, 1500)
    b.instant("[memory]", "cpu_instant_event", 11, 12, 2500, "t", {"Bytes": 64})
    b.counter("mem", 11, 3000, {"a": 1.5})
    b.flow("fwdbwd", "fwdbwd", 11, 12, 2000, 1, "s")
    b.flow("fwdbwd", "fwdbwd", 11, 12, 4000, 1, "f", "e")
    return b.build()


def test_written_file_has_the_kineto_layout(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json"
    stats = write_chrome_trace(sample_trace(), path)
    doc = strict_load(path)
    assert list(doc)[:3] == ["schemaVersion", "deviceProperties", "distributedInfo"]
    assert list(doc)[-2:] == ["traceEvents", "traceName"]
    assert doc["baseTimeNanoseconds"] % 1_000_000_000 == 0
    assert doc["with_stack"] == 1 and doc["displayTimeUnit"] == "ms"
    assert doc["traceName"] == str(path)
    assert stats.events == len(doc["traceEvents"]) == 8
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # ts relative to baseTimeNanoseconds, in microseconds with three decimals
    absolute_ns = doc["baseTimeNanoseconds"] + round(x[0]["ts"] * 1000)
    assert absolute_ns == 1_700_000_000_123_456_789 + 1000
    assert x[0]["dur"] == 900.0
    assert '"ts":123457.789,"dur":900.000' in path.read_text()


def test_rank_is_written_with_a_space_for_hta(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_chrome_trace(sample_trace(), path)
    assert '"rank": 3' in path.read_text()


def test_timestamps_have_exactly_three_decimals(tmp_path: Path) -> None:
    b = TraceBuilder(base_time_ns=5_000_000_000)
    b.span("a", "", 1, 1, 1, 1_000)
    b.span("b", "", 1, 1, -2_500, 7)
    path = tmp_path / "d.json"
    write_chrome_trace(b.build(), path)
    text = path.read_text()
    # the base is the whole second at or before the earliest event (4.0 s here)
    assert '"baseTimeNanoseconds":4000000000,' in text
    assert '"ts":1000000.001,"dur":1.000' in text
    assert '"ts":999997.500,"dur":0.007' in text


def test_gzip_output_matches_plain_output(tmp_path: Path) -> None:
    trace = sample_trace()
    write_chrome_trace(trace, tmp_path / "a.json")
    write_chrome_trace(trace, tmp_path / "a.json.gz")
    plain = strict_load(tmp_path / "a.json")
    zipped = strict_load(tmp_path / "a.json.gz")
    plain.pop("traceName")
    zipped.pop("traceName")
    assert plain == zipped


@pytest.mark.native
@pytest.mark.skipif(native() is None, reason="C extension not built")
def test_c_span_formatter_matches_the_python_twin() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span('q"uote\\', "", 1, "Spans", -5, 0, {"k": "v"})
    odd_args: list[dict[str, Any]] = [
        {"External id": 1, "Input Dims": [[8, 64], [], [3]], "Concrete Inputs": ["", "0."]},
        {"f": 1.5, "tiny": 1e-7, "big": 1e300, "neg": -0.0, "t": True, "n": None, "u": "é中😀"},
        {"ctl": '\x00\x1f\n\t"\\', "tuple": (1, 2), "nested": {"a": {"b": [None]}}},
        {"nan": math.nan, "sur": "\udc80", "huge": 2**80, "set": {1}},
        {1: "int key"},  # type: ignore[dict-item]
        {},
    ]
    for i in range(300):
        args = odd_args[i % len(odd_args)] if i % 3 == 0 else None
        b.span(f"f{i % 7}", "cat" if i % 2 else "", i, -i, i * 1001, i * 7, args)
    trace = b.build()
    strings = [json_bytes(s) for s in trace.strings]
    cols = tuple(
        trace.spans[c] for c in ("name", "cat", "pid", "tid", "start_ns", "dur_ns", "args")
    )
    mod = native()
    assert mod is not None
    for lo, hi in [(0, len(trace.spans)), (3, 40), (10, 10)]:
        assert mod.format_spans(
            cols, lo, hi, strings, trace.args, json_bytes, 17
        ) == format_spans_python(cols, lo, hi, strings, trace.args, json_bytes, 17)
    with pytest.raises(IndexError):
        mod.format_spans(cols, 0, 10_000, strings, trace.args, json_bytes, 0)


event_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1.0, -2.0, 2**62, 2**62 - 1, -(2**62), 9.3e15, 4.6e15, 1.5]),
    st.text(max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.lists(st.integers(), max_size=2),
)
chrome_events = st.one_of(
    st.fixed_dictionaries(
        {"ph": st.sampled_from(["X", "X", "X", "B", "i", "x"])},
        optional={
            key: event_values | st.sampled_from(["stepscope_sampled", "cpu_op"])
            for key in ("name", "cat", "pid", "tid", "ts", "dur", "args")
        },
    ),
    event_values,
)


@pytest.mark.slow
@pytest.mark.native
@pytest.mark.skipif(native() is None, reason="C extension not built")
@settings(max_examples=300, deadline=None)
@given(events=st.lists(chrome_events, max_size=25))
def test_c_event_reader_matches_the_python_twin(events: list[Any]) -> None:
    mod = native()
    assert mod is not None
    tables: list[tuple[dict[str, int], list[str], list[Any]]] = [
        ({"": 0, "seen": 1}, ["", "seen"], ["old"]) for _ in range(2)
    ]
    c_out = mod.spans_from_events(events, *tables[0], "stepscope_sampled")
    py_out = spans_from_events_python(events, *tables[1], "stepscope_sampled")
    assert c_out == py_out
    assert tables[0][0] == tables[1][0] and tables[0][1] == tables[1][1]
    assert [id(a) for a in tables[0][2]] == [id(a) for a in tables[1][2]]


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"ph": "X", "name": "a", "ts": math.nan}, "ts must be a finite number"),
        ({"ph": "X", "name": "a", "ts": 1, "dur": 1e300}, "dur must be a finite number"),
        ({"ph": "X", "name": "a", "ts": 2**70}, "ts must be a finite number"),
        ({"ph": "X", "name": "a", "ts": 1, "pid": 2**63}, "pid must be an integer"),
        ({"ph": "X", "name": "a", "ts": 1, "tid": True}, "tid must be an integer"),
    ],
)
def test_out_of_range_event_values_are_named(
    tmp_path: Path, event: dict[str, Any], message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "ok", "ts": 0}, event]}))
    with pytest.raises(ChromeTraceError, match=rf"traceEvents\[1\]: {message}"):
        read_chrome_trace(path)


def test_spans_keep_file_order_across_int_and_string_labels(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "X", "name": "b", "pid": "GPU", "tid": 2.0, "ts": 2},
        {"ph": "X", "name": "c", "ts": 3, "dur": 1.5},
    ]
    path = tmp_path / "order.json"
    path.write_text(json.dumps(events))
    spans = list(read_chrome_trace(path).iter_spans())
    assert [(s.name, s.pid, s.tid, s.dur_ns) for s in spans] == [
        ("a", 1, 1, 0),
        ("b", "GPU", 2, 0),
        ("c", 0, 0, 1500),
    ]


hostile_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=20
) | st.sampled_from(['"', "\\", "\x00\x1f\x7f", "\udc80", "\ud800x", "\u2028\u2029", "é中😀", ""])
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | hostile_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=6,
)
labels = st.integers(min_value=-(2**40), max_value=2**40) | hostile_text
times = st.integers(min_value=0, max_value=2**50)
span_rows = st.tuples(
    hostile_text,
    hostile_text,
    labels,
    labels,
    times,
    st.integers(0, 2**40),
    st.none() | st.dictionaries(hostile_text, json_values, max_size=3),
)


def clean(value: Any) -> Any:
    """The value as it reads back: strings with surrogates replaced."""
    return json.loads(json_bytes(value))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    spans=st.lists(span_rows, max_size=12),
    instants=st.lists(st.tuples(hostile_text, labels, times, st.sampled_from("tpg")), max_size=4),
    base=st.integers(min_value=0, max_value=2**62),
    gz=st.booleans(),
)
def test_round_trip_keeps_every_event(
    tmp_path: Path, spans: list[Any], instants: list[Any], base: int, gz: bool
) -> None:
    b = TraceBuilder(base_time_ns=base)
    b.metadata["hostile \udc80 key\n"] = {"v": "\x00"}
    for row in spans:
        b.span(*row)
    for name, pid, ts, scope in instants:
        b.instant(name, "cat", pid, 0, ts, scope)
    b.counter("c", 1, 5, {"s": 2.5})
    trace = b.build()
    path = tmp_path / ("rt.json.gz" if gz else "rt.json")
    write_chrome_trace(trace, path)
    strict_load(path)
    back = read_chrome_trace(path)

    def absolute(t: Trace, ns: int) -> int:
        return t.base_time_ns + ns

    want = [
        (
            clean(s.name),
            clean(s.cat),
            clean(s.pid),
            clean(s.tid),
            absolute(trace, s.start_ns),
            s.dur_ns,
            clean(s.args),
        )
        for s in trace.iter_spans()
        if s.cat != SAMPLED_CATEGORY  # the reader drops the flame chart stepscope derives
    ]
    got = [
        (s.name, s.cat, s.pid, s.tid, absolute(back, s.start_ns), s.dur_ns, s.args)
        for s in back.iter_spans()
    ]
    # empty args are not written: they read back as no args
    want = [(*row[:6], row[6] or None) for row in want]
    assert got == want
    assert [
        (clean(i.name), clean(i.pid), absolute(trace, i.ts_ns), i.scope)
        for i in trace.iter_instants()
    ] == [(i.name, i.pid, absolute(back, i.ts_ns), i.scope) for i in back.iter_instants()]
    assert back.metadata[clean("hostile \udc80 key\n")] == {"v": "\x00"}
    assert back.event_count() == trace.event_count()


def test_nan_and_odd_values_in_args_still_give_valid_json(tmp_path: Path) -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("x", "", 1, 1, 0, 1, {"nan": math.nan, "inf": -math.inf, "set": {3, 1}, "b": b"\xff"})
    path = tmp_path / "n.json"
    write_chrome_trace(b.build(), path)
    (event,) = [e for e in strict_load(path)["traceEvents"] if e["ph"] == "X"]
    assert event["args"] == {"nan": "NaN", "inf": "-Infinity", "set": [1, 3], "b": "\ufffd"}


class Exploding:
    def __str__(self) -> str:
        raise RuntimeError("boom while formatting")


def test_failed_write_leaves_no_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "keep.json"
    path.write_text("old")
    b = TraceBuilder(base_time_ns=0)
    for i in range(50_000):
        b.span("x", "", 1, 1, i, 1)
    b.span("bad", "", 1, 1, 0, 1, {"obj": Exploding()})
    with pytest.raises(RuntimeError, match="boom"):
        write_chrome_trace(b.build(), path)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep.json"]
    with pytest.raises(RuntimeError, match="boom"):
        write_chrome_trace(b.build(), tmp_path / "new.json.gz")
    assert sorted(os.listdir(tmp_path)) == ["keep.json"]


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_chrome_trace(sample_trace(), tmp_path / "nope" / "t.json")


def test_reserved_metadata_keys_are_refused(tmp_path: Path) -> None:
    b = TraceBuilder(base_time_ns=0)
    b.metadata["traceEvents"] = 1
    with pytest.raises(ValueError, match="reserved"):
        write_chrome_trace(b.build(), tmp_path / "r.json")


def test_truncated_json_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write_chrome_trace(sample_trace(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ChromeTraceError, match=r"t\.json: invalid JSON at line \d+ column \d+"):
        read_chrome_trace(path)


def test_truncated_gzip_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    write_chrome_trace(sample_trace(), path)
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    with pytest.raises(ChromeTraceError, match="gzip stream is truncated"):
        read_chrome_trace(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"foo": 1}', "not a Chrome trace"),
        ('{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon"}]}', r"traceEvents\[0\]: ts"),
        ('{"traceEvents": [5]}', r"traceEvents\[0\] is not an object"),
        ('{"traceEvents": [], "baseTimeNanoseconds": "x"}', "baseTimeNanoseconds"),
    ],
)
def test_invalid_traces_get_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ChromeTraceError, match=message):
        read_chrome_trace(path)
    with pytest.raises(ChromeTraceError, match="no such trace file"):
        read_chrome_trace(tmp_path / "missing.json")


def test_begin_end_pairs_and_array_form_are_read(tmp_path: Path) -> None:
    path = tmp_path / "be.json"
    path.write_text(
        json.dumps(
            [
                {"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 1},
                {"ph": "X", "name": "between", "pid": 1, "tid": 1, "ts": 1.5, "dur": 0.25},
                {"ph": "B", "name": "inner", "pid": 1, "tid": 1, "ts": 2},
                {"ph": "E", "pid": 1, "tid": 1, "ts": 3},
                {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
                {"ph": "b", "name": "async", "pid": 1, "tid": 1, "ts": 5, "id": 1},
            ]
        )
    )
    trace = read_chrome_trace(path)
    # a plain X event between a B and its E (read in bulk) keeps its place in the file order
    assert [(s.name, s.start_ns, s.dur_ns) for s in trace.iter_spans()] == [
        ("between", 1500, 250),
        ("inner", 2000, 1000),
        ("outer", 1000, 4000),
    ]
    assert trace.metadata["stepscope_skipped_events"] == {"b": 1}


@pytest.fixture(scope="module")
def torch_trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=True,
        profile_memory=True,
    ) as prof:
        for _ in range(3):
            with record_function("train_step"):
                loss = model(torch.randn(16, 32)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            prof.step()
    path = tmp_path_factory.mktemp("torch") / "torch.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return path


@pytest.mark.slow
@pytest.mark.torch
def test_torch_trace_loads_with_the_same_event_count(torch_trace_file: Path) -> None:
    doc = json.loads(torch_trace_file.read_text())
    trace = read_chrome_trace(torch_trace_file)
    assert trace.event_count() == len(doc["traceEvents"])
    by_phase: dict[str, int] = {}
    for e in doc["traceEvents"]:
        by_phase[e["ph"]] = by_phase.get(e["ph"], 0) + 1
    assert len(trace.spans) == by_phase["X"]
    assert len(trace.meta) == by_phase["M"]
    assert len(trace.flows) == by_phase.get("s", 0) + by_phase.get("f", 0)
    assert trace.base_time_ns == doc["baseTimeNanoseconds"]
    names = {s.name for s in trace.iter_spans()}
    assert "train_step" in names and "aten::addmm" in names
    assert any(s.cat == "python_function" for s in trace.iter_spans())
    assert trace.metadata["record_shapes"] == 1
    assert "stepscope_skipped_events" not in trace.metadata


@pytest.mark.torch
def test_torch_trace_survives_a_rewrite(torch_trace_file: Path, tmp_path: Path) -> None:
    trace = read_chrome_trace(torch_trace_file)
    out = tmp_path / "again.json.gz"
    write_chrome_trace(trace, out)
    again = read_chrome_trace(out)
    assert again.event_count() == trace.event_count()
    original = json.loads(torch_trace_file.read_text())["traceEvents"]
    rewritten = strict_load(out)["traceEvents"]

    def key(e: dict[str, Any], base: int) -> tuple[Any, ...]:
        ts = round(e.get("ts", 0) * 1000) + base if e["ph"] != "M" else 0
        return (e["ph"], e.get("name"), e.get("pid"), e.get("tid"), ts, e.get("args"))

    base0 = json.loads(torch_trace_file.read_text())["baseTimeNanoseconds"]
    base1 = strict_load(out)["baseTimeNanoseconds"]
    assert sorted(map(repr, (key(e, base0) for e in original))) == sorted(
        map(repr, (key(e, base1) for e in rewritten))
    )
