"""The compact form's args (version 2: templates and integer columns): tricky JSON comes back
byte for byte, the C parts and their twins write the same bytes, a damaged args section is one
clean error, and version-1 files still read."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest

from stepscope._ext import native
from stepscope.cli import main
from stepscope.jsonenc import RawJsonObject, json_bytes
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.compact_args import (
    _holes,
    splice_args,
    splice_args_python,
    split_args,
    split_args_python,
)
from stepscope.trace.compact_deflate import Deflater
from stepscope.trace.compact_format import ARGS, MAGIC, CompactTraceError, varint
from stepscope.trace.compact_reader import read_compact_trace
from stepscope.trace.compact_writer import _section, write_compact_trace

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def raw(text: bytes, size: int) -> RawJsonObject:
    return RawJsonObject(text, size)


DEEP = b"[" * 70 + b"]" * 70
TRICKY: list[Any] = [
    raw(b'{"External id":7,"Sequence number":3,"Input Dims":[[32,64],[]]}', 3),
    raw(b'{"External id":8,"Sequence number":4,"Input Dims":[[32,64],[]]}', 3),
    raw(b'{"Sequence number":5,"External id":9}', 2),  # the keys in another order
    raw(b'{"k\\"ey":5,"s":"a\\"b\\\\","n":-7,"\\u0041":1}', 4),  # escapes in keys and strings
    raw(b'{"s":"},\\"x\\":1,{[","x":2,"t":"\\\\","y":3}', 4),  # a string that reads like JSON
    raw(b'{"outer":{"id":5,"inner":[1,{"z":2}]},"v":-3,"w":[[1,2],[3]]}', 3),  # nested ints stay
    raw(b'{"min":-9223372036854775808,"max":9223372036854775807,"big":9223372036854775808}', 3),
    raw(b'{"huge":-123456789012345678901234567890,"neg0":-0,"zero":0}', 3),
    raw(b'{"f":1.5,"e":1e5,"E":-2E-3,"g":-0.0,"t":true,"n":null,"no":false,"i":12}', 8),
    raw(b'{ "a" : 1 ,\n\t"b":[ 1 , 2 ] , "c" :{} }', 3),  # blanks kept as they are
    raw('{"é":1,"ключ":"значение","🙂":-2}'.encode(), 3),  # unicode
    raw(b'{"a":1,"a":2}', 1),  # a duplicate key: json.loads keeps one
    raw(b"{}", 0),
    raw(b'{"a":' + DEEP + b',"b":5}', 2),  # nested too deep: stored whole
    raw(b'{"d":' + b"1" * 4301 + b',"e":1}', 2),  # longer than json takes: stored whole
    raw(b'{"a":1,}', 1),  # not JSON: stored whole
    raw(b'{"a":01,"b":2}', 2),
    raw(b'{"a":1 2}', 1),
    raw(b'{"a":"\x01","b":3}', 2),  # a control byte in a string
    raw(b'{"a":"\\x","b":3}', 2),  # an invalid escape
    raw(b'{"a":[1,2},"b":3}', 2),  # brackets that do not match
    raw(b'{"a":1.,"b":-,"c":3}', 3),
    raw(b'{"a":tru,"b":4}', 2),
    raw(b'{"a":5} trailing', 1),
    raw(b"[1,2]", 2),
    raw(b"", 0),
    {},
    {"n": float("nan"), "s": {1, 2}, "u": "\ud800", 3: None, "id": 11},  # through json_bytes
    {"k": [1, 2.5, "v"], "id": 12, "neg": -(2**63)},
]


def test_top_level_plain_integers_are_cut_and_nothing_else() -> None:
    text = b'{"a":1,"b":"2","c":[3],"d":-4,"e":5.0,"f":true,"g":-0,"h":1e2}'
    at = text.index(b"-4")
    assert _holes(text) == [(5, 6, b"a", 1), (at, at + 2, b"d", -4)]
    text = b'{"s":"},\\"x\\":1,{[","x":2}'
    assert _holes(text) == [(len(text) - 2, len(text) - 1, b"x", 2)]
    assert _holes(b'{"o":{"id":5},"v":[1,2]}') == []
    assert _holes(b'{"m":-9223372036854775808,"b":9223372036854775808}') == [
        (5, 25, b"m", -(2**63))
    ]
    for whole in (b'{"a":1,}', b'{"a":01}', b'{"a":' + DEEP + b"}", b"[1]", b'{"a":1}x', b""):
        assert _holes(whole) is None


def test_tricky_args_come_back_byte_for_byte_and_the_twins_agree() -> None:
    args = [*TRICKY, raw(b'{"External id":10,"Sequence number":6,"Input Dims":[[32,64],[]]}', 3)]
    args[1]["Sequence number"]  # parsed: its key count now comes from the dict
    texts = [json_bytes(a) for a in args]
    sizes = [len(a) for a in args]
    payload, twin_sizes = split_args_python(args)
    assert list(twin_sizes) == sizes
    for splice in (splice_args_python, splice_args):
        back, back_sizes = splice(payload)
        assert back == texts and list(back_sizes) == sizes
    assert split_args(args) == (payload, twin_sizes)
    mod = native()
    if mod is not None:
        assert mod.split_args(args, RawJsonObject, json_bytes)[0] == payload
    # a row more of a template: its index and a byte for each growing id
    same = [args[0], args[1], args[-1]]
    assert len(split_args_python(same)[0]) - len(split_args_python(same[:2])[0]) == 3
    assert split_args_python([]) == (b"\x00\x00\x00", twin_sizes[:0])
    assert splice_args_python(b"\x00\x00\x00") == ([], twin_sizes[:0])


def test_damaged_args_payloads_are_value_errors_in_both() -> None:
    payload, _ = split_args_python(TRICKY[:12])
    cases = [payload[:n] for n in range(len(payload))] + [payload + b"\x00"]
    for at in range(0, len(payload), 7):
        flipped = bytearray(payload)
        flipped[at] ^= 0x5A
        cases.append(bytes(flipped))
    cases += [varint(1) + varint(1) + varint(0) + varint(2**63) + b"\x00\x00\x00"]
    cases += [b"\xff" * 11, varint(3) + varint(0) + varint(0)]
    for data in cases:
        try:
            expected: Any = splice_args_python(data)
        except ValueError as exc:
            expected = str(exc)
        try:
            got: Any = splice_args(data)
        except ValueError as exc:
            got = str(exc)
        assert got == expected, data
        if data is not payload and len(data) < len(payload):
            assert expected == "args table truncated or malformed"


def sections(data: bytes) -> list[tuple[bytes, bytes]]:
    """A compact file's sections (kind, payload), as the writer framed them."""
    at, found = len(MAGIC) + 1, []
    while at < len(data):
        kind, at = data[at : at + 1], at + 1
        sizes = []
        for _ in range(2):
            value, shift = 0, 0
            while True:
                b, at = data[at], at + 1
                value |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            sizes.append(value)
        packed = data[at + 4 : at + 4 + sizes[1]]
        at += 4 + sizes[1]
        found.append((kind, zlib.decompress(packed, -15)))
    return found


def test_a_damaged_args_section_is_a_one_line_error(tmp_path: Path) -> None:
    source = tmp_path / "w.json"
    source.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": a}
                    for i, a in enumerate([{"External id": 5, "x": "y"}, {"External id": 6}])
                ]
            }
        )
    )
    whole = tmp_path / "w.sstrace"
    write_compact_trace(read_chrome_trace(source), whole)
    data = whole.read_bytes()
    framed = sections(data)
    assert [kind for kind, _ in framed][:3] == [b"H", b"S", ARGS]
    bad = tmp_path / "bad.sstrace"
    for payload in (framed[2][1][:-1], framed[2][1] + b"\x01", b"\x05\x00\x00"):
        deflater = Deflater(1)
        body = b"".join(
            _section(k, [(payload if k == ARGS else p, False)], deflater) for k, p in framed
        )
        bad.write_bytes(data[: len(MAGIC) + 1] + body)
        with pytest.raises(CompactTraceError) as caught:
            read_compact_trace(bad)
        message = str(caught.value)
        assert message.startswith(f"{bad}: damaged") and "\n" not in message
        assert "args table" in message


def parsed(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_tricky_args_report_the_same_from_either_file(tmp_path: Path) -> None:
    objects = [parsed(json_bytes(a)) for a in TRICKY]
    events = [
        {"ph": "X", "name": f"op{i % 3}", "pid": 1, "tid": 2, "ts": 10 * i, "dur": 5, "args": a}
        for i, a in enumerate(o for o in objects if isinstance(o, dict) and o)
    ]
    source = tmp_path / "tricky.json"
    source.write_text(json.dumps({"traceEvents": events}))
    chrome = read_chrome_trace(source)
    compact = tmp_path / "tricky.sstrace"
    write_compact_trace(chrome, compact)
    back = read_compact_trace(compact)
    assert [json_bytes(a) for a in back.args] == [json_bytes(a) for a in chrome.args]
    assert [len(a) for a in back.args] == [len(a) for a in chrome.args]
    out = tmp_path / "r"
    out.mkdir()
    reports = []
    for path in (source, compact):
        assert main(["report", str(path), "--json", str(out / f"{path.suffix}.json")]) == 0
        reports.append((out / f"{path.suffix}.json").read_bytes().replace(path.name.encode(), b""))
    assert reports[0] == reports[1]


def report(path: Path, out: Path) -> bytes:
    assert main(["report", str(path), "--json", str(out)]) == 0
    return out.read_bytes().replace(path.name.encode(), b"SOURCE")


def test_version_1_files_still_read(tmp_path: Path) -> None:
    """``h200_memory_leak.v1.sstrace``: the Chrome fixture beside it, converted by stepscope
    (with the C extension) before the args were stored by column (format version 1)."""
    v1 = tmp_path / "h200.sstrace"
    shutil.copy(FIXTURES / "h200_memory_leak.v1.sstrace", v1)
    source = tmp_path / "h200.json.gz"
    shutil.copy(FIXTURES / "h200_memory_leak.pt.trace.json.gz", source)
    assert v1.read_bytes()[len(MAGIC)] == 1
    assert report(v1, tmp_path / "a.json") == report(source, tmp_path / "b.json")
    old = read_compact_trace(v1)
    if native() is not None:  # the reading the file was written from
        chrome = read_chrome_trace(source)
        assert [(json_bytes(a), len(a)) for a in old.args] == [
            (json_bytes(a), len(a)) for a in chrome.args
        ]
        for table, columns in chrome.tables.items():
            for name in columns.column_names():
                assert old.tables[table][name].tobytes() == columns[name].tobytes()
    rewritten = tmp_path / "new.sstrace"
    assert main(["convert", str(v1), "--to", "compact", "-o", str(rewritten)]) == 0
    assert rewritten.read_bytes()[len(MAGIC)] == 2
    assert list(map(json_bytes, read_compact_trace(rewritten).args)) == list(
        map(json_bytes, old.args)
    )
