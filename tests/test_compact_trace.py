"""The compact trace form (.sstrace): reports identical to the Chrome JSON's, clean errors on
damaged files, the varint twins, ``stepscope convert`` and ``trace_handler(format=...)``."""

from __future__ import annotations

import random
import shutil
import zlib
from array import array
from pathlib import Path

import pytest

import stepscope
from stepscope._ext import native
from stepscope.cli import main
from stepscope.trace import compact_deflate
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.compact_deflate import PROBE_BYTES, Deflater
from stepscope.trace.compact_format import BLOCK_TABLES, MAGIC, CompactTraceError
from stepscope.trace.compact_reader import read_compact_trace
from stepscope.trace.compact_varint import pack_column, pack_python, unpack_python
from stepscope.trace.compact_writer import write_compact_trace
from stepscope.trace.layouts import TABLE_LAYOUTS
from stepscope.trace.loading import read_trace_file
from stepscope.trace.model import Trace
from stepscope.trace.timebase import column_min, column_min_python

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
SMALL_SHARED = ("cpu_only", "alexnet_gpu", "amd_mi250_rocm", "triton_gpu", "mtia_inference")


def report_json(path: Path, out: Path) -> bytes:
    """``stepscope report PATH --json OUT``'s JSON, the file's name replaced by ``SOURCE``."""
    assert main(["report", str(path), "--json", str(out)]) == 0
    return out.read_bytes().replace(path.name.encode(), b"SOURCE")


def assert_same_report(trace: Trace, tmp_path: Path, stem: str) -> None:
    chrome = tmp_path / "c" / f"{stem}.json"
    compact = tmp_path / "k" / f"{stem}.sstrace"
    chrome.parent.mkdir()
    compact.parent.mkdir()
    write_chrome_trace(trace, chrome)
    write_compact_trace(trace, compact)
    assert compact.stat().st_size < chrome.stat().st_size / 5
    assert report_json(compact, tmp_path / "k.json") == report_json(chrome, tmp_path / "c.json")


def test_window_with_ops_stacks_samples_and_memory_reports_the_same(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with stepscope.profile(
        activities=["CPU", "SAMPLING"],
        with_stack=True,
        profile_memory=True,
        record_shapes=True,
        sampling_rate_hz=1000,
    ) as prof:
        for _ in range(4):
            loss = model(torch.randn(16, 32)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    trace = prof.trace()
    assert len(trace.spans) and len(trace.samples) and len(trace.counters)
    assert_same_report(trace, tmp_path, "window")


@pytest.mark.parametrize("name", SMALL_SHARED)
def test_shared_traces_converted_report_the_same(name: str, tmp_path: Path) -> None:
    source = SHARED / f"{name}.json.gz"
    if not source.exists():
        pytest.skip(f"{source} is not here")
    local = tmp_path / f"{name}.json.gz"
    shutil.copy(source, local)
    compact = tmp_path / "k" / f"{name}.sstrace"
    compact.parent.mkdir()
    assert main(["convert", str(local), "--to", "compact", "-o", str(compact)]) == 0
    assert report_json(compact, tmp_path / "k.json") == report_json(local, tmp_path / "c.json")


@pytest.mark.slow
def test_large_shared_trace_converted_reports_the_same(tmp_path: Path) -> None:
    test_shared_traces_converted_report_the_same("training_rank0_gpu", tmp_path)


def small_compact(tmp_path: Path) -> bytes:
    source = SHARED / "cpu_only.json.gz"
    if not source.exists():
        pytest.skip(f"{source} is not here")
    path = tmp_path / "whole.sstrace"
    write_compact_trace(read_chrome_trace(source), path)
    return path.read_bytes()


def test_damaged_or_truncated_files_are_one_line_errors(tmp_path: Path) -> None:
    whole = small_compact(tmp_path)
    bad = tmp_path / "bad.sstrace"
    cases = [whole[:n] for n in range(0, len(whole), max(1, len(whole) // 40))]
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0x40
    newer = bytearray(whole)
    newer[len(MAGIC)] = 99
    cases += [bytes(flipped), bytes(newer), whole + b"junk"]
    for data in cases:
        bad.write_bytes(data)
        if data[: len(MAGIC)] != MAGIC:
            continue  # not a compact trace at all: the Chrome reader says so
        with pytest.raises(CompactTraceError) as caught:
            read_compact_trace(bad)
        message = str(caught.value)
        assert message.startswith(str(bad)) and "\n" not in message
        with pytest.raises(ValueError):
            read_trace_file(bad)
    bad.write_bytes(whole[: len(whole) - 7])
    assert main(["report", str(bad)]) == 1


def test_varint_twins_agree_with_the_extension() -> None:
    mod = native()
    rng = random.Random(7)
    for code, lo, hi in (
        ("B", 0, 255),
        ("I", 0, 2**32 - 1),
        ("i", -(2**31), 2**31 - 1),
        ("q", -(2**63), 2**63 - 1),
    ):
        values = array(code, [lo, hi, 0] + [rng.randint(lo, hi) for _ in range(200)])
        values.extend(rng.randint(max(lo, -300), min(hi, 300)) for _ in range(200))
        for delta in (False, True):
            packed = pack_python(values, code, delta)
            data, end = unpack_python(packed, 0, len(values), code, delta)
            assert array(code, data) == values and end == len(packed)
            if mod is not None:
                assert mod.pack_varints(values, code, delta) == packed
                assert mod.unpack_varints(packed, 0, len(values), code, delta) == (data, end)
            with pytest.raises(ValueError):
                unpack_python(packed[:-1], 0, len(values), code, delta)
    assert pack_python(array("i", [-5, -1, 3]), "i", False, -1) == pack_python(
        array("i", [-1, -1, 3]), "i", False
    )


def test_column_min_and_empty_refs_twins_agree_with_the_extension() -> None:
    for values in (array("q"), array("q", [5, -(2**63), 2**63 - 1, 0]), array("q", [3])):
        assert column_min_python(values) == column_min(values) == min(values, default=None)
        assert column_min(memoryview(values)) == column_min_python(memoryview(values))
    # args refs to empty mappings (a key count of 0) are written as none, as -1 is
    refs, sizes = array("i", [0, 1, -1, 2, 3, -5, 1]), array("q", [2, 0, 1, 0])
    expected = pack_python(array("i", [0, -1, -1, 2, -1, -1, -1]), "i", True)
    assert pack_python(refs, "i", True, -1, sizes) == expected
    assert pack_column(refs, "i", True, -1, sizes) == expected


def test_each_section_inflates_alone_and_unrepeating_columns_are_stored() -> None:
    deflater = Deflater(1)
    noise = random.Random(5).randbytes(8 * PROBE_BYTES)
    repeats = bytes(range(64)) * 128
    sections = [
        [(b"head", False), (noise, True), (repeats, True), (b"tail", False)],
        [],
        [(repeats, False)],
    ]
    streams = [deflater.stream(parts) for parts in sections]
    for parts, stream in zip(sections, streams, strict=True):
        inflater = zlib.decompressobj(-15)
        assert inflater.decompress(stream) == b"".join(data for data, _ in parts)
        assert inflater.eof and not inflater.unused_data
    # the noise stored past its probe, the repeats compressed
    assert len(noise) < len(streams[0]) < len(noise) + len(repeats) // 8


@pytest.mark.parametrize("library", ["zlib", "zlib_ng.zlib_ng"])
def test_either_compressor_writes_streams_zlib_inflates_to_the_same_trace(
    library: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zlib-ng (the ``fast`` extra) where installed, else zlib: the same format either way."""
    module = pytest.importorskip(library)
    monkeypatch.setattr(compact_deflate, "_compressor", module)
    test_each_section_inflates_alone_and_unrepeating_columns_are_stored()
    source = SHARED / "alexnet_gpu.json.gz"
    if not source.exists():
        pytest.skip(f"{source} is not here")
    trace = read_chrome_trace(source)
    path = tmp_path / "w.sstrace"
    write_compact_trace(trace, path)
    back = read_compact_trace(path)
    assert back.strings == trace.strings and back.args == trace.args
    for table in BLOCK_TABLES:
        for column, _ in TABLE_LAYOUTS[table]:
            got, want = back.tables[table][column], trace.tables[table][column]
            assert list(got) == list(want), (table, column)


def test_trace_handler_writes_the_chosen_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="choose one of"):
        stepscope.trace_handler(tmp_path, format="xml")
    with stepscope.profile(
        torch_ops=False, on_trace_ready=stepscope.trace_handler(tmp_path, format="compact")
    ) as prof:
        sum(range(1000))
    (written,) = tmp_path.glob("*.pt.trace.sstrace")
    assert written.read_bytes().startswith(MAGIC)
    assert isinstance(read_trace_file(written), Trace)
    assert prof.trace_files == [str(written)]  # what `stepscope run` names at its end
