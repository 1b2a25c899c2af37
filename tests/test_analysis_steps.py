"""Steps as the report counts them: the step a profile's stop cut short is not a step."""

from __future__ import annotations

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


def test_a_single_step_window_keeps_its_step() -> None:
    with stepscope.profile(torch_ops=False) as prof:
        sum(range(20_000))
    summary = analyze([("one", prof.trace())]).files[0]
    assert [s.step for s in summary.steps] == [0]
    assert not any("left out" in note for note in summary.notes)
