"""``stepscope report DIR`` on the windows of one run: one panel with the windows named as the
profile names them, memory per step in the combined view, memory timelines beside the traces
left out, and bars that tell categories apart without colour."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
from pathlib import Path

import pytest
from rich.console import Console

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.cli import main
from stepscope.report.progress import reading_bar
from stepscope.report.terminal import GLYPHS, BreakdownBar, render_report
from stepscope.trace.loading import load_traces
from tests.test_report_cli import spin

WINDOWS = 3


def record_windows(out: Path) -> list[str]:
    """Three windows of 3 steps (``--repeat``-style), memory on, each with its memory timeline
    written beside its trace; returns the profile's own log lines about its windows."""
    held: list[bytes] = []

    def handler(prof: stepscope.profile) -> None:
        stepscope.trace_handler(str(out))(prof)
        prof.export_memory_timeline(str(out / f"memory_{prof.step_num}.json"))
        prof.export_memory_timeline(str(out / f"memory_{prof.step_num}.raw.json.gz"))

    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    keep = Keep(logging.INFO)
    log = logging.getLogger("stepscope")
    log.addHandler(keep)
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        schedule = stepscope.schedule(wait=1, warmup=1, active=3, repeat=WINDOWS)
        with stepscope.profile(
            profile_memory=True, torch_ops=False, schedule=schedule, on_trace_ready=handler
        ) as prof:
            for _ in range(5 * WINDOWS):
                with stepscope.record_function("data_loading"):
                    held.append(bytes(20_000))
                    spin(0.001)
                with stepscope.record_function("forward"):
                    spin(0.002)
                prof.step()
    finally:
        log.removeHandler(keep)
        log.setLevel(old_level)
    return [line for line in logged if line.startswith("stepscope: window")]


def test_a_directory_of_windows_reads_as_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = record_windows(tmp_path)
    assert len(list(tmp_path.glob("memory_*"))) == 2 * WINDOWS
    assert main(["report", str(tmp_path)]) == 0  # the timelines are left out, not failures
    captured = capsys.readouterr()
    assert f"left out {2 * WINDOWS} memory timeline file(s)" in captured.err
    text = captured.out
    assert text.count("╭─") == 1 and f"all {WINDOWS} windows" in text
    # each window is named as the profile named it when it ended
    for line in logged:
        name = line.removeprefix("stepscope: ").split(":")[0]
        assert name in text, (name, logged)
    assert "window 1 (steps 2-4)" in text and "window 3 (steps 12-14)" in text


def test_the_combined_view_has_every_windows_memory_per_step(tmp_path: Path) -> None:
    record_windows(tmp_path)
    traces, failures = load_traces(tmp_path, io.StringIO())
    assert not failures and len(traces) == WINDOWS
    report = analyze(traces)
    per_file = [row for s in report.files if s.memory for row in s.memory.steps]
    combined = report.combined.memory
    assert combined is not None and len(per_file) == 3 * WINDOWS
    assert sorted(per_file, key=lambda r: r.step) == combined.steps
    assert combined.peak_bytes == max(s.memory.peak_bytes for s in report.files if s.memory)


def test_piped_bars_name_their_categories(tmp_path: Path) -> None:
    record_windows(tmp_path)
    traces, _ = load_traces(tmp_path, io.StringIO())
    report = analyze(traces)
    out = io.StringIO()
    render_report(report, Console(file=out, width=120, color_system=None))
    text = out.getvalue()
    categories = report.combined.host_total.categories
    bar = BreakdownBar(categories).text(plain=True).plain
    assert len(bar) == 60 and bar in text  # the whole run's bar, in letters
    shown = [c for c in categories if c.pct >= 2]
    assert len(shown) >= 2
    for c in shown:
        glyph = GLYPHS[c.name]
        assert f"{glyph} {c.name} " in text  # the legend's key
        # and the bar's cells of it: 2 % of 60 cells rounds to one (idle at 2.2 % under load)
        assert glyph * max(1, round(0.6 * c.pct) - 1) in bar
    assert "█" not in text


@pytest.mark.parametrize(
    "shares",
    [[97.5, 2.5], [96.7, 1.7, 1.6], [50, 30, 19.9, 0.1], [1] * 100, [33.3, 33.3, 33.4], [60, 40]],
)
def test_a_bar_has_its_width_and_a_cell_for_every_category(shares: list[float]) -> None:
    from stepscope.analysis.result import Category

    categories = [Category(f"c{i}", int(s * 1000), s) for i, s in enumerate(shares)]
    cells = BreakdownBar(categories).cells(categories)
    assert sum(cells) == max(60, len(shares)) and min(cells) >= 1
    for c, n in zip(categories, cells, strict=True):  # each within a cell of its share
        assert abs(n - 60 * c.pct / sum(shares)) < 1 or n == 1


def test_a_terminal_sees_the_files_read_and_a_pipe_no_bar(tmp_path: Path) -> None:
    event = {"ph": "X", "name": "step", "ts": 0, "dur": 5, "pid": 1, "tid": 1}
    for name in ("a.json", "b\x1b[31m.json"):  # a name that would colour the terminal
        (tmp_path / name).write_text(json.dumps({"traceEvents": [event]}))
    assert reading_bar(io.StringIO()) is None
    leader, follower = pty.openpty()
    try:
        with open(follower, "w", encoding="utf-8") as terminal:
            traces, _ = load_traces(tmp_path, terminal, progress=reading_bar(terminal))
        chunks = []
        while True:  # the other side is closed: read until the terminal says so (EIO)
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        shown = b"".join(chunks).decode()
    finally:
        os.close(leader)
    assert len(traces) == 2
    assert "2/2 files" in shown and "reading b\\x1b[31m.json" in shown
