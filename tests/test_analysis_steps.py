"""Steps as the report counts them: the step a profile's stop cut short is not a step."""

from __future__ import annotations

import time

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
    with stepscope.profile(
        activities=["CPU", "SAMPLING"], sampling_rate_hz=1000, torch_ops=False
    ) as prof:
        for _ in range(3):
            with stepscope.record_function("data_loading"):
                busy(0.03)
            busy(0.03)  # the step's own Python
            prof.step()
    summary = analyze([("loop", prof.trace())]).files[0]
    shares = {c.name: c.pct for c in summary.host_total.categories}
    assert 35 < shares["data_loading"] < 65, shares
    assert shares["python"] > 25, shares
