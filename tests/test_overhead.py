"""The overhead every report states, against an external A/B of the same loop.

The profile keeps every step's start and end (``stepscope.step_times``); a report compares the
recorded steps with the unrecorded ones of the same run.  Each test runs the same loop without
stepscope (A) and under the profiler (B), times every step body itself with
``time.perf_counter_ns``, and checks the stated slowdown against (median B recorded / median A)
within max(5 points, 25 %).
"""

from __future__ import annotations

import io
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

import stepscope
from stepscope import _ext
from stepscope.analysis.analyze import analyze
from stepscope.analysis.result import Overhead
from stepscope.report.html import html_document
from stepscope.report.overhead import overhead_lines
from stepscope.report.terminal import render_report
from stepscope.step_times import StepTimes
from stepscope.trace.chrome_reader import read_chrome_trace

pytestmark = pytest.mark.slow

WAIT, WARMUP, ACTIVE, REPEAT = 2, 1, 2, 4
"""Unrecorded and recorded steps interleave (a busy machine's slow spells hit both kinds)."""
CYCLE = WAIT + WARMUP + ACTIVE
ROUNDS = 5
"""Runs without and with stepscope alternate, so the external A/B is interleaved too."""


def _sleep_body() -> None:
    time.sleep(0.015)  # long beside a busy machine's wake-up delays


def _leaf(x: int) -> int:
    return x + 1


def _call_heavy_body() -> None:
    total = 0
    for i in range(6000):
        total = _leaf(total) + _leaf(i)


def _run_a(body: Callable[[], None], steps: int) -> list[int]:
    times = []
    for _ in range(steps):
        began = time.perf_counter_ns()
        body()
        times.append(time.perf_counter_ns() - began)
    return times


def _run_b(
    body: Callable[[], None], tmp_path: Path, **options: object
) -> tuple[Overhead, list[int]]:
    """The loop under the profiler: the stated overhead (from the written trace) and the
    test's own times of the recorded steps."""
    recorded: list[int] = []
    written: list[str] = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    sched = stepscope.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT)
    with stepscope.profile(
        schedule=sched,
        on_trace_ready=lambda p: written.append(p.export_chrome_trace(tmp_path / "t.json").path),
        torch_ops=False,
        **options,  # type: ignore[arg-type]
    ) as prof:
        for step in range(CYCLE * REPEAT + 1):
            began = time.perf_counter_ns()
            body()
            spent = time.perf_counter_ns() - began
            if step % CYCLE >= WAIT + WARMUP and step < CYCLE * REPEAT:
                recorded.append(spent)
            prof.step()
    assert len(written) == REPEAT, "a window was not saved"
    report = analyze([("t.json", read_chrome_trace(written[-1]))])
    stated = report.combined.overhead
    assert stated is not None
    return stated, recorded


def _ab(body: Callable[[], None], tmp_path: Path, **options: object) -> tuple[Overhead, float]:
    """Alternating runs without (A) and with (B) stepscope: the last B's stated overhead with
    the median of every B's stated slowdown, and the external slowdown (per round, B's recorded
    step bodies against the same round's A; the median of the rounds)."""
    slowdowns: list[float] = []
    a_medians: list[float] = []
    externals: list[float] = []
    for n in range(ROUNDS):
        a_round = _run_a(body, 2 * CYCLE)
        a_medians.append(statistics.median(a_round))
        stated, recorded = _run_b(body, tmp_path / str(n), **options)
        assert stated.recorded_steps == ACTIVE * REPEAT
        assert stated.unrecorded_steps + stated.cold_steps == WAIT * REPEAT
        assert stated.warmup_steps == WARMUP * REPEAT
        assert stated.slowdown_pct is not None
        slowdowns.append(stated.slowdown_pct)
        externals.append(100.0 * (statistics.median(recorded) / a_medians[-1] - 1))
    external = statistics.median(externals)
    said = statistics.median(slowdowns)
    # the machine's own drift between rounds of the same unprofiled loop widens the margin:
    # on a loaded 2-core machine it moves the A/B comparison as much as stepscope does
    # and so does each figure's own spread over the rounds (369-577 % stated at load 6 for one
    # call-heavy loop under with_stack; 237-621 % stated against 835 % measured over all rounds
    # pooled at load 5, when a burst of load fell on the B runs)
    drift = 100.0 * (max(a_medians) - min(a_medians)) / min(a_medians)
    spread = (max(slowdowns) - min(slowdowns)) / 2 + (max(externals) - min(externals)) / 2
    margin = max(5.0, 0.25 * abs(external)) + 2 * drift + spread
    assert abs(said - external) <= margin, (slowdowns, externals, drift)
    return stated, external


def test_a_sleep_bound_loop_states_about_no_overhead(tmp_path: Path) -> None:
    _, external = _ab(_sleep_body, tmp_path)
    assert abs(external) < 25  # a sleeping step costs the recorder nothing much


def test_a_call_heavy_loop_under_with_stack_states_its_slowdown(tmp_path: Path) -> None:
    if _ext.native() is None:
        pytest.skip(
            "the twin tracer's cost swings between runs by more than the margin (1871 % and "
            "12820 % measured in two runs); the A/B is checked with the extension"
        )
    _run_a(_call_heavy_body, 3)  # warm the interpreter's caches first
    stated, external = _ab(_call_heavy_body, tmp_path, with_stack=True)
    assert external > 20  # tracing every call is not free: the test would be toothless
    assert stated.collector_ns.get("python", 0) > 0  # the tracer's start, stop and collect


def test_every_report_format_states_the_overhead(tmp_path: Path) -> None:
    stated, _ = _run_b(_sleep_body, tmp_path)
    report = analyze([("t.json", read_chrome_trace(tmp_path / "t.json"))])
    as_json = json.loads(report.to_json())
    assert as_json["combined"]["overhead"]["recorded_steps"] == ACTIVE * REPEAT
    text = " ".join(overhead_lines(report.combined.overhead))
    warm = as_json["combined"]["overhead"]["unrecorded_steps"]
    assert f"{ACTIVE * REPEAT} recorded, {warm} warm unrecorded" in text
    assert "Overhead: recorded steps took" in text
    console = Console(file=io.StringIO(), width=200)
    render_report(report, console)
    assert "Overhead: recorded steps took" in console.file.getvalue()  # type: ignore[attr-defined]
    page = html_document(report)
    assert '"overhead"' in page and "function overheadText" in page
    assert stated.edge_ns["recorded"] > 0  # the window's stop and save happened between steps


def test_the_ring_keeps_the_last_steps_and_counts_the_dropped(implementation: str) -> None:
    times = StepTimes(capacity=4, implementation=implementation)
    for kind in (0, 0, 1, 2, 3, 2, 0):
        times.begin(kind)
        times.end()
    assert len(times) == 4 and times.dropped == 3
    kept = times.durations()
    assert [len(kept[k]) for k in ("unrecorded", "warmup", "recorded")] == [1, 0, 3]
    times.end()  # no step open: nothing happens
    assert len(times) == 4
    with pytest.raises(ValueError, match="capacity"):
        StepTimes(capacity=0, implementation=implementation)


def test_a_step_time_is_the_loop_body_and_edges_fall_between(implementation: str) -> None:
    times = StepTimes(implementation=implementation)
    began = time.perf_counter_ns()
    times.begin(0)
    time.sleep(0.01)
    times.end()
    time.sleep(0.005)  # the profiler's work at a step edge
    times.begin(2)
    times.end()
    outside = time.perf_counter_ns() - began
    (inside,) = times.durations()["unrecorded"]
    assert 0.01e9 <= inside <= outside
    assert 0.005e9 <= times.edges()["unrecorded"] <= outside - inside


def test_the_sampler_states_its_own_time_inside_the_steps(tmp_path: Path) -> None:
    def body() -> None:  # steps of 20 ms at least: a starved sampler thread still ticks
        began = time.perf_counter_ns()
        while time.perf_counter_ns() - began < 20_000_000:
            _call_heavy_body()

    stated, recorded = _run_b(
        body,
        tmp_path,
        activities=[stepscope.ProfilerActivity.SAMPLING],
        sampling_rate_hz=2000.0,
    )
    meta = read_chrome_trace(tmp_path / "t.json").metadata["stepscope_sampler"]
    expected = int((meta["busy_ms"] + meta.get("handler_ms", 0)) * 1e6)
    assert stated.in_steps_ns["sampler"] == expected
    assert 0 < expected < sum(recorded)  # a share of the recorded steps, not more
    assert "Measured inside the recorded steps: sampler" in " ".join(overhead_lines(stated))


def test_too_few_unrecorded_steps_state_no_slowdown(tmp_path: Path) -> None:
    # two unrecorded steps are the program's warm-up, not a baseline: no percentage is stated
    sched = stepscope.schedule(wait=2, warmup=1, active=4, repeat=1)
    with stepscope.profile(schedule=sched, torch_ops=False) as prof:
        for _ in range(8):
            time.sleep(0.002)
            prof.step()
    [summary] = analyze([("t", prof.trace())]).files
    stated = summary.overhead
    assert stated is not None and stated.unrecorded_steps + stated.cold_steps == 2
    assert stated.recorded_steps == 4
    assert stated.slowdown_pct is None
    [first, *_] = overhead_lines(stated)
    assert "too few steps to compare" in first and "%" not in first


def _warming_loop(first_steps_ms: list[float], steady_ms: float, wait: int) -> Overhead:
    """A loop whose first steps take ``first_steps_ms`` (a program warming up), then
    ``steady_ms``; ``wait`` unrecorded steps, one warmup, four recorded."""
    sched = stepscope.schedule(wait=wait, warmup=1, active=4, repeat=1)
    with stepscope.profile(schedule=sched, torch_ops=False) as prof:
        for n in range(wait + 1 + 4):
            time.sleep((first_steps_ms[n] if n < len(first_steps_ms) else steady_ms) / 1e3)
            prof.step()
    [summary] = analyze([("t", prof.trace())]).files
    assert summary.overhead is not None
    return summary.overhead


def test_the_cold_first_steps_are_no_baseline() -> None:
    # issue 36, point 3: the demo stated "-84.4 %" against its cold first steps
    stated = _warming_loop([150.0, 60.0], steady_ms=15.0, wait=6)
    assert stated.cold_steps == 2, "the first step, and the next one still 4x slower"
    assert stated.unrecorded_steps == 4
    assert stated.slowdown_pct is not None
    outside = 0.0  # the loop sleeps the same 15 ms recorded or not
    assert abs(stated.slowdown_pct - outside) <= 25.0, stated
    assert "2 cold first steps left out" in overhead_lines(stated)[0]


def test_unrecorded_steps_still_getting_faster_state_no_comparison() -> None:
    stated = _warming_loop([40.0, 36.0, 32.0, 28.0, 20.0, 16.0, 12.0], steady_ms=12.0, wait=7)
    assert not stated.settled
    assert stated.slowdown_pct is None
    [first, *_] = overhead_lines(stated)
    assert "no trustworthy comparison" in first and "%" not in first


def test_optimizers_in_turn_state_no_slowdown() -> None:
    # a GAN's D and G steps differ by kind: medians of recorded and unrecorded steps mix them
    # in different proportions (the matrix saw -4.2 % stated against +41.6 % outside)
    from stepscope.analysis.overhead import trace_overhead
    from stepscope.trace.model import TraceBuilder

    def stated(optimizers: list[str]) -> Overhead:
        b = TraceBuilder(base_time_ns=0)
        b.metadata["stepscope_overhead"] = {
            "steps": {
                "unrecorded": {"count": 6, "median_ns": 1_000_000, "settled": True},
                "warmup": {"count": 1, "median_ns": 1_000_000},
                "recorded": {"count": 6, "median_ns": 1_100_000},
            }
        }
        b.metadata["stepscope_step_source"] = {"on": "optimizer", "optimizers": optimizers}
        found = trace_overhead(b.build())
        assert found is not None
        return found

    one = stated(["Adam"])
    assert one.slowdown_pct is not None and abs(one.slowdown_pct - 10.0) < 1e-9
    two = stated(["Adam", "Adam"])
    assert two.slowdown_pct is None and two.optimizers_in_turn == 2
    assert "2 optimizers end steps in turn" in overhead_lines(two)[0]
