"""The Chrome trace reader fails cleanly on hostile input (issue 13, points 4 and 10).

Every failure is a ``ChromeTraceError`` naming the file (and the field where there is one);
the C scanner and its twin give the same outcome for each input.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from stepscope._ext import native
from stepscope.trace import chrome_reader, read_chrome_trace
from stepscope.trace.chrome_reader import ChromeTraceError

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native

X = {"ph": "X", "name": "op", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}


def doc(*events: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"traceEvents": [X, *events], **top}


def write(path: Path, value: Any) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def outcomes(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The error message (or "ok: <spans>") with the scanner and with the twin."""
    found = []
    for use_native in (True, False):
        if use_native and native() is None:
            continue
        with monkeypatch.context() as m:
            if not use_native:
                m.setattr(chrome_reader, "native", lambda: None)
            try:
                trace = read_chrome_trace(path)
                found.append(f"ok: {list(trace.spans['start_ns'])} {list(trace.flows['flow_id'])}")
            except ChromeTraceError as exc:
                found.append(str(exc))
    return found


FLOW = {"ph": "s", "name": "f", "cat": "c", "pid": 1, "tid": 1, "ts": 1.0}

BAD: dict[str, tuple[Any, str]] = {
    "flow id beyond 64 bits": (doc({**FLOW, "id": 2**130}), "id must be an integer"),
    "flow id NaN": ('{"traceEvents":[{"ph":"s","id":NaN,"ts":1}]}', "id must be an integer"),
    "flow id a list": (doc({**FLOW, "id": [1]}), "id must be an integer"),
    "4300+-digit ts": ('{"traceEvents":[{"ph":"X","ts":' + "9" * 5000 + "}]}", "digits"),
    "4300+-digit int in args": (
        '{"traceEvents":[{"ph":"X","ts":1,"args":{"a":' + "9" * 5000 + "}}]}",
        "digits",
    ),
    "200k-deep nesting": ('{"traceEvents":[' + "[" * 200_000 + "]" * 200_000 + "]}", "deep"),
    "stackFrames a list": (doc(samples=[{"sf": "1", "ts": 1}], stackFrames=[1]), "stackFrames"),
    "samples an object": (doc(samples={"a": 1}), "samples must be a list"),
    "stack frame a string": (doc(samples=[{"sf": "1"}], stackFrames={"1": "x"}), "stackFrames"),
    "stack frame line a word": (
        doc(samples=[{"sf": "1"}], stackFrames={"1": {"name": "f", "line": "x"}}),
        "line must be an integer",
    ),
    "sample weight a word": (
        doc(samples=[{"sf": "1", "weight": "x"}], stackFrames={"1": {"name": "f"}}),
        "weight must be an integer",
    ),
    "sample pid a list": (
        doc(samples=[{"sf": "1", "pid": [1]}], stackFrames={"1": {"name": "f"}}),
        "samples[0]: bad pid",
    ),
    "sample ts huge": (
        doc(samples=[{"sf": "1", "ts": 1e300}], stackFrames={"1": {"name": "f"}}),
        "samples[0]: bad ts",
    ),
    "baseTimeNanoseconds a string": (doc(baseTimeNanoseconds="1"), "baseTimeNanoseconds"),
    "metadata args a list": (doc({"ph": "M", "name": "x", "args": [1]}), "args must be"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_hostile_input_is_a_named_chrome_trace_error(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content, field = BAD[case]
    path = write(tmp_path / "t.json", content)
    found = outcomes(path, monkeypatch)
    assert all(str(path) in message and field in message for message in found), found
    assert len(set(found)) == 1, found  # the scanner and the twin agree


def test_string_flow_ids_read_as_numbers_or_stable_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path / "t.json",
        doc({**FLOW, "id": "zz"}, {**FLOW, "id": "0x10"}, {**FLOW, "id": "-7"}, {**FLOW, "id": 3}),
    )
    found = outcomes(path, monkeypatch)
    assert len(set(found)) == 1
    ids = list(read_chrome_trace(path).flows["flow_id"])
    assert ids[1:] == [16, -7, 3]
    stable = int.from_bytes(hashlib.blake2b(b"zz", digest_size=8).digest(), "little") >> 2
    assert ids[0] == stable  # the same in every process (not the salted hash())


def test_counter_values_too_large_for_a_float_are_left_out(tmp_path: Path) -> None:
    counter = {"ph": "C", "name": "mem", "pid": 1, "ts": 1, "args": {"a": 10**400, "b": 2}}
    trace = read_chrome_trace(write(tmp_path / "t.json", doc(counter)))
    assert list(trace.counters["value"]) == [2.0]


def test_numbers_of_64_and_more_characters_read_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_float = "1." + "0" * 80 + "1"
    long_int = "1" + "0" * 30  # beyond 64 bits: the per-event reader refuses it
    text = (
        '{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":' + long_float + ',"dur":1},'
        '{"ph":"X","name":"b","pid":1,"tid":1,"ts":2,"dur":1},'
        '{"ph":"X","name":"c","pid":1,"tid":1,"ts":3,"dur":' + long_float + "}]}"
    )
    found = outcomes(write(tmp_path / "a.json", text), monkeypatch)
    assert found[0] == "ok: [1000, 2000, 3000] []" and len(set(found)) == 1  # file order
    text = '{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":' + long_int + "}]}"
    found = outcomes(write(tmp_path / "b.json", text), monkeypatch)
    assert "ts must be a finite number" in found[0] and len(set(found)) == 1


def test_multi_member_gzip_is_read_whole(tmp_path: Path) -> None:
    text = json.dumps(doc({**X, "name": "second", "ts": 5.0})).encode()
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]))
    trace = read_chrome_trace(path)
    assert sorted(trace.strings[i] for i in trace.spans["name"]) == ["op", "second"]


def test_trailing_garbage_after_gzip_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc()).encode()) + b"garbage")
    with pytest.raises(ChromeTraceError, match="7 bytes of trailing data"):
        read_chrome_trace(path)


@pytest.mark.slow
def test_a_gzip_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    compress = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b" " * (1 << 20)
    bomb = b"".join(compress.compress(zeros) for _ in range(300)) + compress.flush()
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(bomb)  # about 300 kB that inflate to 300 MiB
    assert len(bomb) * chrome_reader.MAX_INFLATE_RATIO < 300 << 20
    with pytest.raises(
        ChromeTraceError, match=f"more than {chrome_reader.MIN_INFLATE_LIMIT} bytes"
    ):
        read_chrome_trace(path)  # the default: 100x the file or 256 MiB
    with pytest.raises(ChromeTraceError, match="more than 1000 bytes"):
        read_chrome_trace(path, max_inflated_bytes=1000)
    small = tmp_path / "ok.json.gz"
    small.write_bytes(gzip.compress(json.dumps(doc()).encode()))
    assert len(read_chrome_trace(small, max_inflated_bytes=1000).spans) == 1
    with pytest.raises(ValueError, match="max_inflated_bytes must be a positive int"):
        read_chrome_trace(small, max_inflated_bytes=0)
