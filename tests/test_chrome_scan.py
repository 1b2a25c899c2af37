"""The C scanner of Chrome traces gives the same trace as its twin (json.loads + bulk columns)."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope._ext import native
from stepscope.trace import (
    Trace,
    TraceBuilder,
    chrome_reader,
    read_chrome_trace,
    write_chrome_trace,
)
from stepscope.trace.raw_args import RawArgs
from tests.analysis_helpers import SHARED

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.native,
    pytest.mark.skipif(native() is None, reason="C extension not built"),
]


STRING_COLUMNS = {"name", "cat", "series", "file"}
LABEL_COLUMNS = {"pid", "tid"}


def resolved(trace: Trace, column: str, values: Any) -> list[Any]:
    """A column's values with string ids, labels and args refs decoded."""
    if column in STRING_COLUMNS:
        return [trace.strings[v] for v in values]
    if column in LABEL_COLUMNS:
        return [trace.label(v) for v in values]
    if column == "args":
        return [None if v < 0 else dict(trace.args[v]) for v in values]
    return list(values)


def snapshot(trace: Trace) -> dict[str, Any]:
    """Everything a trace holds, in table order, with strings and args decoded (the scanner and
    its twin may number strings and args differently, and intern different unused strings)."""
    return {
        "base": trace.base_time_ns,
        "tables": {
            name: {c: resolved(trace, c, t[c]) for c in t.column_names()}
            for name, t in trace.tables.items()
        },
        "args": sorted(json.dumps(dict(a), sort_keys=True) for a in trace.args),
        "metadata": dict(trace.metadata),
        "name": trace.trace_name,
    }


def both_ways(
    path: Path, monkeypatch: pytest.MonkeyPatch, drop: bool = False
) -> tuple[Trace, Trace]:
    scanned = read_chrome_trace(path, drop_kineto_bookkeeping=drop)
    with monkeypatch.context() as m:
        m.setattr(chrome_reader, "native", lambda: None)
        twin = read_chrome_trace(path, drop_kineto_bookkeeping=drop)
    return scanned, twin


def outcomes_both_ways(
    path: Path, monkeypatch: pytest.MonkeyPatch, drop: bool = False
) -> list[dict[str, Any] | str]:
    """The trace (as a snapshot) or the error message, scanned and by the twin."""
    outcomes: list[dict[str, Any] | str] = []
    for use_native in (True, False):
        with monkeypatch.context() as m:
            if not use_native:
                m.setattr(chrome_reader, "native", lambda: None)
            try:
                outcomes.append(snapshot(read_chrome_trace(path, drop_kineto_bookkeeping=drop)))
            except chrome_reader.ChromeTraceError as exc:
                outcomes.append(str(exc))
    return outcomes


KINETO_LIKE = {
    "schemaVersion": 1,
    "deviceProperties": [],
    "record_shapes": 1,
    "baseTimeNanoseconds": 1_790_000_000_000_000_000,
    "traceEvents": [
        {"ph": "M", "name": "process_name", "ts": 1.5, "pid": 7, "tid": 0, "args": {"name": "py"}},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::addmm",
            "pid": 7,
            "tid": 7,
            "ts": 4480253043910.2,
            "dur": 0.27,
            "args": {
                "External id": 5,
                "Record function id": 0,
                "Ev Idx": 4,
                "Concrete Inputs": ["", "", "1"],
                "Input Dims": [[64, 256], [], []],
                "Input type": ["float", "", "Scalar"],
            },
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 7,
            "tid": 7,
            "ts": 12,
            "dur": 3,
            "args": {"Concrete Inputs": ["", ""], "Input Dims": [[1], [1]], "Ev Idx": 5},
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": 'step "é" \u00e9',
            "pid": 7,
            "tid": "GPU 0",
            "ts": 13,
            "dur": 1,
            "args": {"Record function id": 3},
        },
        {"ph": "s", "id": 1, "pid": 7, "tid": 7, "ts": 12, "cat": "fwdbwd", "name": "fwdbwd"},
        {
            "ph": "f",
            "id": 1,
            "pid": 7,
            "tid": 7,
            "ts": 14,
            "cat": "fwdbwd",
            "name": "fwdbwd",
            "bp": "e",
        },
        {"ph": "i", "s": "t", "name": "mark", "pid": 7, "tid": 7, "ts": 15},
        {"ph": "X", "name": "no args", "ts": 16.0005, "pid": 7.0, "tid": 7},
        {"ph": "X", "name": None, "cat": None, "ts": -3, "args": None},
        {"ph": "X", "name": "sampled", "cat": "stepscope_sampled", "ts": 1},
    ],
    "traceName": "t.json",
}


@pytest.mark.parametrize("indent", [None, 2, 4])
@pytest.mark.parametrize("drop", [False, True])
def test_a_kineto_like_trace_reads_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indent: int | None, drop: bool
) -> None:
    path = tmp_path / "k.json"
    path.write_text(json.dumps(KINETO_LIKE, indent=indent, ensure_ascii=indent is None))
    scanned, twin = both_ways(path, monkeypatch, drop)
    assert snapshot(scanned) == snapshot(twin)
    assert any(isinstance(a, RawArgs) for a in scanned.args)
    addmm = next(s for s in scanned.iter_spans() if s.name == "aten::addmm")
    assert addmm.args is not None
    if drop:
        assert "Ev Idx" not in addmm.args and "Record function id" not in addmm.args
        assert addmm.args["Concrete Inputs"] == ["", "", "1"]
        mm = next(s for s in scanned.iter_spans() if s.name == "aten::mm")
        assert mm.args == {"Input Dims": [[1], [1]]}
    else:
        assert addmm.args["Ev Idx"] == 4


def test_raw_args_are_written_compact_and_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "k.json"
    path.write_text(json.dumps(KINETO_LIKE, indent=2))
    scanned, twin = both_ways(path, monkeypatch, drop=True)
    write_chrome_trace(scanned, tmp_path / "a.json")
    write_chrome_trace(twin, tmp_path / "b.json")
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    a.pop("traceName"), b.pop("traceName")
    assert a == b
    assert '"Input Dims":[[64,256],[],[]]' in (tmp_path / "a.json").read_text()


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "args": {"k": tru}}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": NaN}]}',
        '{"traceEvents": [{"ph": "X", "name": "a\\x", "ts": 1}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "args": {"k": "\xff"}}]}',
    ],
)
def test_what_the_scanner_declines_gets_the_ordinary_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("latin-1"))
    outcomes = outcomes_both_ways(path, monkeypatch)
    assert outcomes[0] == outcomes[1]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
events = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "s", "t", "f", "i", "I", "n", "M", "C", "B", "E", "P"])},
    optional={
        "name": st.text(max_size=5) | st.none() | st.integers(),
        "cat": st.sampled_from(["cpu_op", "stepscope_sampled", ""]) | st.none(),
        "pid": st.integers(-(2**63), 2**63) | st.text(max_size=3) | st.floats(allow_nan=False),
        "tid": st.integers(-5, 5) | st.sampled_from([1.0, 2.5, "GPU"]),
        "ts": st.integers(-(2**64), 2**64) | st.floats(allow_nan=False),
        "dur": st.integers(0, 10**6) | st.floats(0, 1e6) | st.none(),
        "args": st.dictionaries(
            st.sampled_from(["Ev Idx", "Record function id", "Concrete Inputs", "Input Dims", "k"]),
            json_values,
            max_size=4,
        )
        | st.none()
        | st.integers()
        | st.dictionaries(st.sampled_from(["a", "b", "\u00e9"]), json_values, max_size=3),
        "id": st.integers(-(2**64), 2**64)
        | st.floats(allow_nan=False)
        | st.sampled_from(["0x1f", "7", "ab", "\u00e9", " 12", "1_0"])
        | st.none(),
        "s": st.sampled_from(["t", "p", "g", "x", ""]) | st.integers(0, 1) | st.none(),
        "bp": st.sampled_from(["e", "s", ""]) | st.none(),
    },
)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    doc_events=st.lists(events, max_size=12), indent=st.sampled_from([None, 1]), drop=st.booleans()
)
def test_any_event_list_reads_the_same_both_ways(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    doc_events: list[Any],
    indent: int | None,
    drop: bool,
) -> None:
    path = tmp_path / "h.json"
    path.write_text(
        json.dumps({"traceEvents": doc_events, "other": [1, {"a": None}]}, indent=indent)
    )
    outcomes = outcomes_both_ways(path, monkeypatch, drop)
    assert outcomes[0] == outcomes[1]


number_texts = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}{'.' + frac if frac else ''}{exp}",
    st.sampled_from(["", "-"]),
    st.integers(0, 10**19).map(str),
    st.text("0123456789", max_size=20),
    st.sampled_from(["", "e3", "E-5", "e+2", "e-22", "e300", "e-320"]),
)


@settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.lists(number_texts, min_size=1, max_size=8))
def test_times_of_any_spelling_read_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, texts: list[str]
) -> None:
    # ts/dur texts as written, not as json.dumps spells them: long mantissas, many decimals
    events = ",".join(
        f'{{"ph": "{ph}", "name": "n", "ts": {text}, "dur": {text.lstrip("-")}, "id": 1}}'
        for text in texts
        for ph in ("X", "i", "f")
    )
    path = tmp_path / "n.json"
    path.write_text(f'{{"traceEvents": [{events}]}}')
    outcomes = outcomes_both_ways(path, monkeypatch)
    assert outcomes[0] == outcomes[1]


def test_kineto_times_read_exactly(tmp_path: Path) -> None:
    # 19-digit mantissas with 3 decimals, as Kineto writes them: ns = round(float(text) * 1000)
    texts = ["1712195495519695.812", "1712195495519695.813", "9007199254740993.001", "4.5"]
    events = ",".join(f'{{"ph": "X", "name": "n", "ts": {t}, "dur": 1}}' for t in texts)
    path = tmp_path / "k.json"
    path.write_text(f'{{"traceEvents": [{events}]}}')
    trace = read_chrome_trace(path)
    assert list(trace.spans["start_ns"]) == [round(float(t) * 1000) for t in texts]


def test_long_mantissas_read_as_python_reads_them(tmp_path: Path) -> None:
    # mantissas beyond 53 bits with 1-19 decimals, and exact ties between two doubles
    rng = random.Random(19)
    texts: list[str] = []
    while len(texts) < 20_000:
        decimals = rng.randint(1, 19)
        digits = str(rng.randint(2**53 + 1, min(10 ** rng.randint(16, 19) - 1, 2**64 - 1)))
        digits = digits.rjust(decimals + 1, "0")
        text = f"{digits[:-decimals]}.{digits[-decimals:]}"
        if abs(float(text)) * 1000 < 9.2e18:
            texts.append(text)
    for _ in range(2_000):  # (2b + 1) / 8 lies halfway between two doubles
        digits = str((2 * rng.randint(2**53, 2**54 - 1) + 1) * 125)
        texts.append(f"-{digits[:-3]}.{digits[-3:]}")
    events = ",".join(f'{{"ph":"X","name":"n","ts":{t},"dur":0}}' for t in texts)
    path = tmp_path / "n.json"
    path.write_text(f'{{"traceEvents":[{events}]}}')
    assert list(read_chrome_trace(path).spans["start_ns"]) == [
        round(float(t) * 1000) for t in texts
    ]


SHARED_TRACES = sorted(p.name for p in SHARED.glob("*.json.gz") if not p.name.startswith("et_"))
KINETO_PHASES = {"spans": "X", "instants": "iIn", "flows": "stf", "meta": "M", "counters": "C"}


@pytest.mark.skipif(not SHARED_TRACES, reason="no shared traces on this machine")
@pytest.mark.parametrize("name", SHARED_TRACES or ["none"])
def test_every_shared_trace_reads_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / name
    shutil.copyfile(SHARED / name, path)
    for drop in (False, True):
        outcomes = outcomes_both_ways(path, monkeypatch, drop)
        assert outcomes[0] == outcomes[1]
    # every phase is in the tables, as many events as json.loads finds in the file
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    trace = read_chrome_trace(path)
    for table, phases in KINETO_PHASES.items():
        count = sum(1 for e in events if e.get("ph") in phases)
        found = trace.counter_event_count() if table == "counters" else len(trace.tables[table])
        assert found == count, table


BEGIN_END_AND_COUNTERS = [
    {"ph": "B", "name": "outer", "cat": "c", "pid": 1, "tid": "T", "ts": 1, "args": {"a": 1}},
    {"ph": "B", "name": "inner", "pid": 1.0, "tid": "T", "ts": 2},
    {"ph": "E", "pid": 1, "tid": "T", "ts": 3.5},
    {"ph": "X", "name": "x", "pid": 1, "tid": 2, "ts": 2, "dur": 1},
    {"ph": "E", "pid": 1, "tid": "T", "ts": 9, "name": 5},
    {"ph": "E", "pid": 1, "tid": 3, "ts": 9},
    {"ph": "B", "name": "never closed", "pid": 2, "tid": 2, "ts": 1, "args": []},
    {"ph": "C", "name": "mem", "pid": 1, "ts": 4, "args": {"a": 1, "b": 2.5, "a\u00e9": 3}},
    {"ph": "C", "name": "dup", "pid": 1, "ts": 5, "args": {"x": True, "y": "s", "z": 10**400}},
    {"ph": "C", "name": "none", "pid": 1, "ts": 6},
    {"ph": "C", "name": "big", "pid": 1, "tid": "T", "ts": 7, "args": {"v": 2**64 + 1}},
]


def test_begin_end_pairs_and_counters_read_in_bulk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "be.json"
    text = json.dumps({"traceEvents": BEGIN_END_AND_COUNTERS})
    # a duplicate key in a counter's args: the last value wins, at the first key's place
    path.write_text(text.replace('"b": 2.5', '"b": 2.5, "a": 7'))
    outcomes = outcomes_both_ways(path, monkeypatch)
    assert outcomes[0] == outcomes[1]
    # only the counters without a numeric value are left to the per-event reader (which skips)
    mod = native()
    assert mod is not None
    builder = TraceBuilder(base_time_ns=0)
    scanned = mod.scan_trace(
        path.read_bytes(), *builder.bulk_tables(), "s", RawArgs, json.loads, len, False
    )
    assert scanned is not None
    assert [index for index, _ in scanned[1]] == [8, 9]
    trace = read_chrome_trace(path)
    spans = {s.name: s for s in trace.iter_spans()}
    assert (spans["inner"].start_ns, spans["inner"].dur_ns) == (2000, 1500)
    assert (spans["outer"].dur_ns, spans["outer"].tid, spans["outer"].args) == (8000, "T", {"a": 1})
    counters = {c.name: c.values for c in trace.iter_counter_events()}
    assert counters == {"mem": {"a": 7.0, "b": 2.5, "a\u00e9": 3.0}, "big": {"v": float(2**64 + 1)}}
    assert trace.metadata["stepscope_skipped_events"] == {
        "E(unmatched)": 1,
        "B(unmatched)": 1,
        "C(no numeric values)": 2,
    }


def test_a_begin_with_bad_args_is_the_same_error_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [
        {"ph": "B", "name": "b", "ts": 1, "args": [1]},
        {"ph": "E", "ts": 2},
    ]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": events}))
    outcomes = outcomes_both_ways(path, monkeypatch)
    assert outcomes[0] == outcomes[1]
    assert "traceEvents[1]: args must be an object" in str(outcomes[0])


frame_keys = st.sampled_from(["1", "2", "3", "9"]) | st.integers(1, 3) | st.none()
samples = st.fixed_dictionaries(
    {},
    optional={
        "pid": st.integers(0, 3) | st.sampled_from(["P", 1.0, 1.5]),
        "tid": st.integers(0, 3) | st.sampled_from(["T", None]),
        "ts": st.integers(0, 10**6) | st.floats(0, 1e6) | st.none(),
        "sf": frame_keys | st.floats(1, 3) | st.booleans(),
        "weight": st.integers(-3, 3) | st.sampled_from([1.0, 2.5, "2", None, True]),
        "name": st.sampled_from(["idle", "cpu", "\u00e9"]),
        "cpu": st.integers(0, 3),
    },
)
stack_frames = st.fixed_dictionaries(
    {
        "1": st.just({"name": "main", "category": "a.py", "line": 1}),
        "2": st.fixed_dictionaries(
            {"name": st.just("f"), "parent": st.sampled_from(["1", 1, "7"])},
            optional={"line": st.integers(0, 9) | st.just("x")},
        ),
        "3": st.just({"name": "g", "parent": "2", "category": "b.py"}),
    }
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    doc_samples=st.lists(samples, max_size=10) | st.none(),
    frames=stack_frames | st.none() | st.just([]),
    indent=st.sampled_from([None, 1]),
)
def test_any_samples_read_the_same_both_ways(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    doc_samples: list[Any] | None,
    frames: Any,
    indent: int | None,
) -> None:
    doc: dict[str, Any] = {"traceEvents": [{"ph": "i", "name": "m", "ts": 1}]}
    if frames is not None:
        doc["stackFrames"] = frames
    if doc_samples is not None:
        doc["samples"] = doc_samples
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc, indent=indent))
    outcomes = outcomes_both_ways(path, monkeypatch)
    assert outcomes[0] == outcomes[1]


def test_samples_are_read_in_bulk_and_keep_their_stacks(tmp_path: Path) -> None:
    builder = TraceBuilder(base_time_ns=0)
    main = builder.frame("main", "a.py", 1)
    leaf = builder.frame("work", "a.py", 7)
    for k in range(50):
        stack = builder.stack([main, leaf] if k % 2 else [main])
        builder.sample(1, "worker", k * 1000, stack, weight=1 + k % 3, idle=k % 5 == 0)
    written = builder.build()
    path = tmp_path / "samples.json"
    write_chrome_trace(written, path)
    mod = native()
    assert mod is not None
    b = TraceBuilder(base_time_ns=0)
    scanned = mod.scan_trace(
        path.read_bytes(), *b.bulk_tables(), "s", RawArgs, json.loads, len, False
    )
    assert scanned is not None and scanned[4] is not None  # the samples list was scanned
    assert list(read_chrome_trace(path).iter_samples()) == list(written.iter_samples())
