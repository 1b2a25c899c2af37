"""Cut-short steps (a window the profile stopped inside: the loop ended, the program crashed, a
rank stopped) are shown as such and never enter statistics, diffs or rankings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.cli import main
from stepscope.commands.diff import EXIT_NO_STEPS
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.test_ranks import ROOT
from tests.test_report_cli import record_loop, spin

SPIN_S = 0.002


class Crash(Exception):
    """The program's own failure, in the middle of a window."""


def profiled_loop(out: Path, iterations: int, crash_at: int | None = None) -> Path:
    """A loop of SPIN_S steps under a schedule whose window (steps 2-6) outlasts the loop."""
    schedule = stepscope.schedule(wait=1, warmup=1, active=5, repeat=1)
    try:
        with stepscope.profile(
            schedule=schedule, on_trace_ready=stepscope.trace_handler(str(out))
        ) as prof:
            for i in range(iterations):
                with stepscope.record_function("work"):
                    spin(SPIN_S)
                if i == crash_at:
                    raise Crash
                prof.step()
    except Crash:
        pass
    return out


def read(out: Path) -> list[tuple[str, object]]:
    return [(p.name, read_chrome_trace(p)) for p in sorted(out.glob("*.json"))]


def test_a_flushed_final_window_leaves_its_open_step_out(tmp_path: Path) -> None:
    out = profiled_loop(tmp_path / "t", iterations=5)  # steps 2, 3, 4 done; 5 opened
    [(name, trace)] = read(out)
    summary = analyze([(name, trace)]).combined  # type: ignore[list-item]
    assert [s.step for s in summary.steps] == [2, 3, 4]
    assert [s.step for s in summary.cut_short] == [5]
    # every counted step spun SPIN_S (the loop's own measure); the cut one did not
    assert summary.step_stats.count == 3 and summary.step_stats.min_ns >= SPIN_S * 1e9
    assert summary.cut_short[0].dur_ns < SPIN_S * 1e9
    assert any("step 5 was cut short" in n for n in summary.notes)


def test_a_window_cut_after_one_step_has_no_statistics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = profiled_loop(tmp_path / "crash", iterations=8, crash_at=2)  # inside step 2
    [(name, trace)] = read(crashed)
    summary = analyze([(name, trace)]).combined  # type: ignore[list-item]
    assert summary.steps == [] and summary.step_stats.count == 0
    assert [s.step for s in summary.cut_short] == [2]
    out = tmp_path / "r.json"
    assert main(["report", str(crashed), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cut short" in text and "no complete step" in text
    data = json.loads(out.read_text())["combined"]
    assert data["step_stats"]["count"] == 0 and data["cut_short"][0]["step"] == 2
    # a diff gate against it has nothing to compare: its own status and one line
    base = record_loop(tmp_path / "base", steps=4, large_s=0.001)
    assert main(["diff", str(base), str(crashed), "--fail-if-slower"]) == EXIT_NO_STEPS
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only cut-short steps" in err[0]


def test_a_crash_later_in_the_window_keeps_the_complete_steps(tmp_path: Path) -> None:
    crashed = profiled_loop(tmp_path / "crash", iterations=8, crash_at=3)  # inside step 3
    [(name, trace)] = read(crashed)
    summary = analyze([(name, trace)]).combined  # type: ignore[list-item]
    assert [s.step for s in summary.steps] == [2]
    assert [s.step for s in summary.cut_short] == [3]
    assert summary.step_stats.max_ns == summary.steps[0].dur_ns


def test_a_rank_cut_short_after_one_step_is_no_straggler(tmp_path: Path) -> None:
    """Rank 1 crashed inside its first recorded step after a long stall: that step is not a
    'slowest step', and rank 1 is not ranked as a straggler on it."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank, crash_at in ((0, None), (1, 2)):
        out = tmp_path / f"r{rank}"
        if crash_at is None:
            profiled_loop(out, iterations=5)
        else:
            schedule = stepscope.schedule(wait=1, warmup=1, active=5, repeat=1)
            try:
                with stepscope.profile(
                    schedule=schedule, on_trace_ready=stepscope.trace_handler(str(out))
                ) as prof:
                    for i in range(5):
                        spin(0.03 if i == crash_at else SPIN_S)  # stalls, then dies
                        if i == crash_at:
                            raise Crash
                        prof.step()
            except Crash:
                pass
        [written] = out.glob("*.json")
        written.rename(ranks / f"host_{rank}_rank{rank}.1.pt.trace.json")
    traces = [(p.name, read_chrome_trace(p)) for p in sorted(ranks.glob("*.json"))]
    report = analyze(traces)
    assert report.ranks is not None
    assert all(s.rank != 1 for s in report.ranks.stragglers)
    assert sorted(s.step or 0 for s in report.combined.cut_short) == [2, 5]  # rank 1, rank 0
    # the stalled step rank 1 died in is no "slowest step" (it is cut short, not slow)
    slowest = {(s.source, s.step) for s in report.combined.step_stats.slowest}
    assert {source for source, _ in slowest} <= {name for name, _ in traces}, slowest
    assert ("host_1_rank1.1.pt.trace.json", 2) not in slowest, slowest
    assert any("missing on rank(s) [1]" in n for n in report.ranks.notes)


_KILLED_JOB = """
import os, signal, sys, time
import stepscope

rank = int(os.environ["RANK"])
schedule = stepscope.schedule(wait=1, warmup=1, active=2, repeat=2)
with stepscope.profile(
    schedule=schedule, on_trace_ready=stepscope.trace_handler(sys.argv[1])
) as prof:
    for i in range(8):
        with stepscope.record_function("work"):
            time.sleep(0.002)
        if i == 6:  # the first step of the second window
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            raise SystemExit("the collective failed: rank 1 is gone")
        prof.step()
"""


def test_a_step_a_killed_rank_never_had_is_named_missing(tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed in step 6; rank 0's step 6 ends when its collective fails, so its
    window holds that step only, cut short.  The report said step 6 was missing on rank 1
    until cut-short steps were left out of the cross-rank steps; it says so again."""
    out = tmp_path / "traces"
    for rank, status in ((0, 1), (1, -signal.SIGKILL)):
        done = subprocess.run(
            [sys.executable, "-c", _KILLED_JOB, str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "RANK": str(rank), "PYTHONPATH": str(ROOT / "src")},
        )
        assert done.returncode == status, done.stderr
    traces = [(p.name, read_chrome_trace(p)) for p in sorted(out.glob("*.json"))]
    assert len(traces) == 3  # rank 0: both windows; rank 1: the first only
    report = analyze(traces)
    assert report.ranks is not None
    assert [s.step for s in report.ranks.steps] == [2, 3]
    assert "step 6 is missing on rank(s) [1] (cut short on rank(s) [0])" in report.ranks.notes
    shown = subprocess.run(
        [sys.executable, "-m", "stepscope", "report", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"},
    )
    assert "step 6 is missing on rank(s) [1]" in shown.stdout, shown.stderr
