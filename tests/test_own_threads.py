"""stepscope's own threads never show in the user's results: the memory watcher's idle wait is
not traced, and "Self CPU time total" of a one-thread program stays within its wall time
(issue 23, point 3)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

import stepscope
from stepscope.collectors.python import PythonTracerCollector


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def _watched_window(implementation: str) -> dict[str, Any]:
    """A one-thread program's window with the memory watcher on (run in a fresh process, so no
    thread another test left running is traced with it)."""
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
    starts, durs = trace.spans["start_ns"], trace.spans["dur_ns"]
    ends = [start + dur for start, dur in zip(starts, durs, strict=True)]
    return {
        "names": sorted({trace.strings[n] for n in trace.spans["name"]}),
        "python_tids": sorted(
            {
                tid
                for tid, cat in zip(trace.spans["tid"], trace.spans["cat"], strict=True)
                if trace.strings[cat] == "python_function"
            }
        ),
        "main_tid": threading.get_native_id(),
        "total_self_us": sum(row.self_cpu_time_total for row in prof.key_averages()),
        "steps_ns": [
            d
            for n, d in zip(trace.spans["name"], durs, strict=True)
            if trace.strings[n].startswith("ProfilerStep#")
        ],
        "walls_ns": walls,
        "window_us": (max(ends) - min(starts)) / 1e3,
    }


@pytest.mark.parametrize("implementation", ["native", "python"], indirect=True)
def test_the_memory_watcher_is_not_in_the_traced_calls(implementation: str) -> None:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        got = pool.submit(_watched_window, implementation).result(timeout=300)
    assert not any("Condition.wait" in name for name in got["names"]), got["names"][:20]
    assert got["python_tids"] == [got["main_tid"]], "only the program's own thread"
    assert sum(got["steps_ns"]) >= 0.9 * sum(got["walls_ns"][1:]), "the steps measured the loop"
    # one thread ran: its self times cannot add up to more than the window (the watcher's
    # idle wait used to double it)
    total_self, window_us = got["total_self_us"], got["window_us"]
    assert total_self <= 1.1 * window_us + 1000, (total_self, window_us)
