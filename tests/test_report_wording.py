"""What the reports say, checked against what the program did: DataLoader advice only to a
program with a DataLoader, merged process names, no stray ``null`` on an HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.cli import main
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.merge import merge_ranks
from tests import test_report_html
from tests.test_report_cli import record_loop, spin
from tests.test_report_html import assert_clean, load

browser = test_report_html.browser
"""Headless Chromium (the HTML report tests' fixture)."""


def data_loading_advice(out: Path) -> str:
    [trace] = out.glob("*.json")
    summary = analyze([("t", read_chrome_trace(trace))]).combined
    [rule] = [r for r in summary.recommendations if r.rule == "data_loading"]
    return rule.advice


def test_dataloader_options_only_for_a_program_with_a_dataloader(tmp_path: Path) -> None:
    # a plain loop whose "data_loading" region is most of the step: no DataLoader in it
    plain = tmp_path / "plain"
    with stepscope.profile(on_trace_ready=stepscope.trace_handler(str(plain))) as prof:
        for _ in range(3):
            with stepscope.record_function("data_loading"):
                spin(0.004)
            spin(0.001)
            prof.step()
    advice = data_loading_advice(plain)
    assert "DataLoader(" not in advice and "next batch" in advice
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class SlowItems(Dataset):  # type: ignore[type-arg]
        """A slow input pipeline: each item takes 0.5 ms to make."""

        def __len__(self) -> int:
            return 32

        def __getitem__(self, index: int) -> Any:
            spin(0.0005)
            return torch.full((8,), float(index))

    out = tmp_path / "loader"
    with stepscope.profile(on_trace_ready=stepscope.trace_handler(str(out))) as prof:
        for batch in DataLoader(SlowItems(), batch_size=8):
            (batch * 2).sum()
            prof.step()
    assert "DataLoader(num_workers>0" in data_loading_advice(out)


def test_merged_processes_are_named_by_what_they_hold(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        out = tmp_path / f"r{rank}"
        with stepscope.profile(on_trace_ready=stepscope.trace_handler(str(out))) as prof:
            for _ in range(2):
                torch.randn(16, 16).mm(torch.randn(16, 16))
                prof.step()
        [written] = out.glob("*.json")
        written.rename(ranks / f"host_{rank}_rank{rank}.1.pt.trace.json")
    traces = [(p.name, read_chrome_trace(p)) for p in sorted(ranks.glob("*.json"))]
    tracks = {str(pid) for _, t in traces for pid in t.process_names()} | {
        str(e.pid) for _, t in traces for e in t.iter_spans()
    }
    assert "Spans" in tracks  # torch's profiler session track, which has no process name
    names = merge_ranks(traces).process_names().values()
    assert all(" · pid " not in n or n.split(" · pid ")[1].isdigit() for n in names), names
    assert "rank 0 · profiler session (Spans)" in names and "rank 1 · python" in names


def test_html_without_memory_has_no_stray_null(browser: Any, tmp_path: Path) -> None:
    out = record_loop(tmp_path / "t", steps=3, large_s=0.001)
    page = tmp_path / "r.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    logs = load(browser, page)
    assert_clean(browser, logs)
    text = browser.execute_script("return document.getElementById('app').innerText")
    assert "null" not in text and "Host" in text
