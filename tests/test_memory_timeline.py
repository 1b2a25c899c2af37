"""``export_memory_timeline``: torch's file shapes, torch's categories agreeing with torch's own
export of the same loop in the same run, plain-Python timelines, and the page in a browser."""

from __future__ import annotations

import gzip
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope import clock
from stepscope.profiler.memory_timeline import (
    TORCH_CATEGORIES,
    memory_timeline,
    python_timeline,
    write_timeline,
)
from stepscope.trace import read_chrome_trace
from tests.analysis_helpers import SHARED
from tests.test_memory import make_block, python_loop, transient_size
from tests.test_report_html import assert_clean, browser, inked_pixels, load, screenshot

__all__ = ["browser"]  # the fixture, shared with the report's browser tests

ACTIONS = {1, 2, 3, 4}  # PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY


def training_loop(steps: int) -> tuple[Any, Any, Any]:
    """A small model, Adam, one batch: the step function and the objects it trains."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # the optimizer's state exists before either profiler looks
    return step, model, opt


def per_category(sizes: list[list[int]]) -> tuple[list[int], list[int]]:
    """Highest and last bytes of each category (torch's layout: index 0 is always 0)."""
    width = len(sizes[0])
    return [max(row[i] for row in sizes) for i in range(1, width)], sizes[-1][1:]


def profiled(step: Callable[[], None], steps: int) -> stepscope.profile:
    """``steps`` training steps under ``profile_memory=True, record_shapes=True`` (torch's
    categorizer reads operator inputs)."""
    with stepscope.profile(profile_memory=True, record_shapes=True) as prof:
        for _ in range(steps):
            step()
            prof.step()
    return prof


def test_torch_categories_agree_with_torchs_own_export(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    step, model, opt = training_loop(3)
    prof = profiled(step, 3)
    ours = memory_timeline(prof, "cpu")
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as theirs:
        for _ in range(3):
            step()
            theirs.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs.export_memory_timeline(str(tmp_path / "torch.json"), "cpu")
    _, torch_sizes = json.loads((tmp_path / "torch.json").read_text())
    our_high, our_last = per_category(ours.sizes)
    torch_high, torch_last = per_category(torch_sizes)
    assert ours.categories == list(TORCH_CATEGORIES)
    # Same loop, same tensors: every category within 1 % (or 64 bytes: a scalar's rounding).
    for name, a, b in zip(TORCH_CATEGORIES, our_high, torch_high, strict=True):
        assert abs(a - b) <= max(64, 0.01 * b), (name, a, b)
    for name, a, b in zip(TORCH_CATEGORIES, our_last, torch_last, strict=True):
        assert abs(a - b) <= max(64, 0.01 * b), (name, a, b)
    # ... and against the tensors themselves
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    names = list(TORCH_CATEGORIES)
    assert our_last[names.index("PARAMETER")] == params
    assert our_last[names.index("OPTIMIZER_STATE")] == state
    assert our_high[names.index("GRADIENT")] == params
    assert ours.unknown_bytes == sum(r[2] for r in ours.raw if r[1] in (1, 2) and r[3] == 7)


def test_every_format_loads_back_in_torchs_shapes(tmp_path: Path) -> None:
    step, _, _ = training_loop(2)
    prof = profiled(step, 2)
    timeline = memory_timeline(prof, "cpu")
    prof.export_memory_timeline(tmp_path / "t.json", "cpu")
    prof.export_memory_timeline(str(tmp_path / "t.json.gz"), "cpu")
    prof.export_memory_timeline(str(tmp_path / "t.raw.json.gz"), "cpu")
    prof.export_memory_timeline(str(tmp_path / "t.html"), "cpu")
    plain = json.loads((tmp_path / "t.json").read_text())
    assert plain == json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    times, sizes = plain
    assert times == sorted(times) and len(times) == len(sizes)
    assert all(len(row) == len(TORCH_CATEGORIES) + 1 and row[0] == 0 for row in sizes)
    raw = json.loads(gzip.decompress((tmp_path / "t.raw.json.gz").read_bytes()))
    reference = json.loads(gzip.decompress((SHARED / "memory_timeline.raw.gz").read_bytes()))
    for rows in (raw, reference):  # the shape torch writes: [ts, action, bytes, category]
        assert rows and all(len(r) == 4 and all(isinstance(v, int) for v in r) for r in rows)
        assert {r[1] for r in rows} <= ACTIONS
        assert {r[3] for r in rows} <= set(range(len(TORCH_CATEGORIES)))
    # the raw events replay to the plot's last point, category by category
    held = [0] * len(TORCH_CATEGORIES)
    for _, _, size, category in raw:
        held[category] += size
    assert held == sizes[-1][1:] == timeline.sizes[-1][1:]
    page = (tmp_path / "t.html").read_text()
    assert "uPlot" in page and "<script src" not in page


def test_plain_python_timeline_by_module(tmp_path: Path) -> None:
    held: list[Any] = []
    prof = python_loop(held, leak=False, steps=4)
    timeline = memory_timeline(prof)  # no torch data: the Python heap
    assert timeline.device == "python"
    assert timeline.categories[0] == "tests"  # the top-level package that allocated the most
    high = max(row[1] for row in timeline.sizes)
    assert high == pytest.approx(transient_size(), rel=0.05)
    prof.export_memory_timeline(tmp_path / "py.raw.json.gz")
    raw = json.loads(gzip.decompress((tmp_path / "py.raw.json.gz").read_bytes()))
    assert {r[1] for r in raw} <= {2, 4}
    replayed: dict[int, int] = {}
    for _, _, size, category in raw:
        replayed[category] = replayed.get(category, 0) + size
    assert [replayed.get(i, 0) for i in range(len(timeline.categories))] == timeline.sizes[-1][1:]


@pytest.mark.parametrize("mode", [True, "exact"], ids=["hook", "tracemalloc"])
def test_the_export_is_what_a_reader_of_the_saved_trace_computes(
    tmp_path: Path, mode: bool | str
) -> None:
    prof = python_loop([], leak=True, steps=4, mode=mode)
    prof.export_chrome_trace(str(tmp_path / "window.json"))
    saved = read_chrome_trace(tmp_path / "window.json")
    assert saved.base_time_ns != prof.trace().base_time_ns  # the file has a base of its own
    for suffix in (".json", ".json.gz", ".raw.json.gz", ".html"):
        live, read = tmp_path / f"live{suffix}", tmp_path / f"read{suffix}"
        prof.export_memory_timeline(live)
        write_timeline(python_timeline(saved), read)
        opened = gzip.open if suffix.endswith(".gz") else open
        with opened(live, "rb") as a, opened(read, "rb") as b:
            assert a.read() == b.read(), suffix
    # ... and its points are the snapshots' own: the step ends' exact totals, in Unix time
    timeline = memory_timeline(prof)
    rows = prof.trace().metadata["stepscope_memory"]["steps"]
    ends = {clock.to_unix_ns(row["end_ns"]) // 1000: row["python_current"] for row in rows}
    points = set(zip(timeline.times_us, map(sum, timeline.sizes), strict=True))
    matched = [t for t, held in ends.items() if (t, held) in points]
    # the hook snapshots every step end (its sampled shares scaled to the exact total held);
    # tracemalloc those its time budget allows, the first ones at least
    assert len(matched) == len(ends) if mode is True else matched


def test_a_trace_without_the_heap_by_module_says_so() -> None:
    trace = read_chrome_trace(SHARED / "cpu_only.json.gz")
    with pytest.raises(ValueError, match="profile_memory=True"):
        python_timeline(trace)


def test_bad_requests_say_what_to_do(tmp_path: Path) -> None:
    with stepscope.profile(torch_ops=False) as plain:
        make_block()
    with pytest.raises(RuntimeError, match="needs profile_memory=True"):
        plain.export_memory_timeline(tmp_path / "t.json")
    prof = python_loop([], leak=False, steps=2)
    with pytest.raises(ValueError, match=r"\.html .*\.raw\.json\.gz"):
        prof.export_memory_timeline(tmp_path / "t.txt")
    with pytest.raises(ValueError, match="device='python'"):
        prof.export_memory_timeline(tmp_path / "t.json", device="cpu")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_torch_categories_without_record_shapes_say_what_to_pass(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    step, _, _ = training_loop(2)
    with stepscope.profile(profile_memory=True) as prof:
        for _ in range(2):
            step()
            prof.step()
    with pytest.raises(ValueError, match="needs record_shapes=True"):
        prof.export_memory_timeline(tmp_path / "t.json", "cpu")
    assert not list(tmp_path.iterdir())
    prof.export_memory_timeline(tmp_path / "py.json", "python")  # the heap needs no shapes
    assert (tmp_path / "py.json").exists()


def test_timeline_page_and_report_in_browser(browser: Any, tmp_path: Path) -> None:
    from stepscope.cli import main

    step, _, _ = training_loop(3)
    held: list[Any] = []
    with stepscope.profile(
        profile_memory=True,
        record_shapes=True,
        on_trace_ready=stepscope.trace_handler(str(tmp_path / "traces")),
    ) as prof:
        for _ in range(5):
            step()
            held.append(bytearray(100_000))
            prof.step()
    page = tmp_path / "timeline.html"
    prof.export_memory_timeline(page, "cpu")
    logs = load(browser, page)
    assert_clean(browser, logs)
    assert inked_pixels(browser, "#chart") > 1000
    screenshot(browser, tmp_path, "memory-timeline.png")
    [trace] = sorted((tmp_path / "traces").glob("*.pt.trace.json"))
    report = tmp_path / "report.html"
    assert main(["report", str(trace), "--html", str(report)]) == 0
    logs = load(browser, report)
    assert_clean(browser, logs)
    assert inked_pixels(browser, "#memory-chart") > 1000
    text = browser.execute_script("return document.getElementById('memory').textContent")
    assert "Alive at the peak" in text and "Possible leak: Python heap" in text
    screenshot(browser, tmp_path, "memory-report.png")
