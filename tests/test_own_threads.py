"""stepscope's own threads never show in the user's results: the memory watcher's idle wait is
not traced, and "Self CPU time total" of a one-thread program stays within its wall time
(issue 23, point 3)."""

from __future__ import annotations

import threading
import time

import pytest

import stepscope
from stepscope.collectors.python import PythonTracerCollector


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


@pytest.mark.parametrize("implementation", ["native", "python"], indirect=True)
def test_the_memory_watcher_is_not_in_the_traced_calls(implementation: str) -> None:
    tracer = PythonTracerCollector(implementation=implementation)
    prof = stepscope.profile(
        activities=["CPU"],
        profile_memory=True,
        torch_ops=False,
        collectors=[tracer],
        schedule=stepscope.schedule(wait=0, warmup=1, active=3, repeat=1),
    )
    walls = []
    with prof:
        for _ in range(4):
            began = time.perf_counter_ns()
            _busy(0.03)
            walls.append(time.perf_counter_ns() - began)
            prof.step()
    trace = prof.trace()
    names = {trace.strings[n] for n in trace.spans["name"]}
    assert not any("Condition.wait" in name for name in names), sorted(names)[:20]
    python_tids = {
        tid
        for tid, cat in zip(trace.spans["tid"], trace.spans["cat"], strict=True)
        if trace.strings[cat] == "python_function"
    }
    assert python_tids == {threading.get_native_id()}, "only the program's own thread"
    table = prof.key_averages()
    total_self = sum(row.self_cpu_time_total for row in table)  # µs
    steps = [
        d
        for n, d in zip(trace.spans["name"], trace.spans["dur_ns"], strict=True)
        if trace.strings[n].startswith("ProfilerStep#")
    ]
    starts, durs = trace.spans["start_ns"], trace.spans["dur_ns"]
    ends = [start + dur for start, dur in zip(starts, durs, strict=True)]
    window_us = (max(ends) - min(starts)) / 1e3
    assert sum(steps) >= 0.9 * sum(walls[1:]), "the steps measured what the loop measured"
    # one thread ran: its self times cannot add up to more than the window (the watcher's
    # idle wait used to double it)
    assert total_self <= 1.1 * window_us + 1000, (total_self, window_us)
