"""Steps as the report counts them: the step a profile's stop cut short is not a step."""

from __future__ import annotations

import time

import pytest

import stepscope
from stepscope.analysis.analyze import analyze


def loop(steps: int) -> stepscope.profile:
    with stepscope.profile(torch_ops=False) as prof:
        for _ in range(steps):
            with stepscope.record_function("work"):
                sum(range(20_000))
            prof.step()
    return prof


def test_the_step_opened_after_the_last_iteration_is_left_out_and_said() -> None:
    prof = loop(4)
    trace = prof.trace()
    recorded = sorted(s.name for s in trace.iter_spans() if s.name.startswith("ProfilerStep#"))
    assert recorded == [f"ProfilerStep#{n}" for n in range(5)]  # #4: opened, then stopped
    summary = analyze([("loop", trace)]).files[0]
    assert [s.step for s in summary.steps] == [0, 1, 2, 3]
    assert any("left out" in note for note in summary.notes)


def test_a_window_that_never_stepped_is_the_whole_trace_as_torchs_is() -> None:
    # torch writes no ProfilerStep span for a profile without step() calls; neither does
    # stepscope, so the whole trace is analysed as one, and nothing is said to be cut short
    with stepscope.profile(torch_ops=False) as prof:
        sum(range(20_000))
    trace = prof.trace()
    assert not any(s.name.startswith("ProfilerStep#") for s in trace.iter_spans())
    summary = analyze([("one", trace)]).files[0]
    assert not summary.has_steps and summary.steps == [] and summary.cut_short == []
    assert any("no ProfilerStep spans" in note for note in summary.notes)
    assert not any("cut short" in note for note in summary.notes)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(500))


def test_sampled_python_inside_a_data_loading_region_stays_data_loading() -> None:
    loading_s = python_s = 0.0  # this loop's own clock
    with stepscope.profile(
        activities=["CPU", "SAMPLING"], sampling_rate_hz=1000, torch_ops=False
    ) as prof:
        for _ in range(3):
            t0 = time.perf_counter()
            with stepscope.record_function("data_loading"):
                busy(0.03)
            t1 = time.perf_counter()
            busy(0.03)  # the step's own Python
            python_s += time.perf_counter() - t1
            loading_s += t1 - t0
            prof.step()
    trace = prof.trace()
    summary = analyze([("loop", trace)]).files[0]
    shares = {c.name: c.pct for c in summary.host_total.categories}
    steps_s = sum(s.dur_ns for s in summary.steps) / 1e9
    # the samples taken inside data_loading leave its time whole: its share is the clock's
    assert shares["data_loading"] == pytest.approx(100 * loading_s / steps_s, abs=2), shares
    # Python's share is estimated from samples. How far samples stray from the clock on this
    # machine now is measured on data_loading, whose time the span gives: the share of the
    # samples that fell inside it against its share of the two halves' time
    spans, strings = trace.spans, trace.strings
    loading = [
        (spans["start_ns"][i], spans["start_ns"][i] + spans["dur_ns"][i])
        for i in range(len(spans))
        if strings[spans["name"][i]] == "data_loading"
    ]
    steps = [
        (spans["start_ns"][i], spans["start_ns"][i] + spans["dur_ns"][i])
        for i in range(len(spans))
        if strings[spans["name"][i]] in {f"ProfilerStep#{s.step}" for s in summary.steps}
    ]
    busy_ts = [
        ts
        for ts, idle in zip(trace.samples["ts_ns"], trace.samples["idle"], strict=True)
        if not idle and any(lo <= ts < hi for lo, hi in steps)
    ]
    inside = sum(1 for ts in busy_ts if any(lo <= ts < hi for lo, hi in loading))
    halves_s = loading_s + python_s
    stray_pts = 100 * abs(inside / len(busy_ts) - loading_s / halves_s) * halves_s / steps_s
    # 20 points: the sampler's own spread on a quiet machine (shares of ~50 seen at 40-55)
    expected = 100 * python_s / steps_s
    assert abs(shares["python"] - expected) <= 20 + stray_pts, (shares, expected, stray_pts)
