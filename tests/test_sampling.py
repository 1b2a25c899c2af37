"""stepscope.sampling: the one-call function profiler, its backends, lock, errors and outputs."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from stepscope.collectors.sampler import SAMPLER_THREAD_NAME, TRUNCATED_FRAME
from stepscope.sampling import (
    BackendUnavailable,
    FunctionProfiler,
    FunctionProfilerError,
    ProfileResult,
    sampled,
)
from stepscope.sampling.pyspy import find_py_spy
from stepscope.sampling.result import trim_stacks
from stepscope.trace.model import TraceBuilder
from tests.sampling_workloads import hot, last_cpu_share, workload


def phases(first: float, second: float) -> None:
    phase_one(first)
    phase_two(second)


def phase_one(seconds: float) -> None:
    workload(seconds)


def phase_two(seconds: float) -> None:
    workload(seconds)


def py_spy_binary() -> str | None:
    try:
        return find_py_spy("py-spy")
    except BackendUnavailable:
        return None


needs_py_spy = pytest.mark.skipif(py_spy_binary() is None, reason="py-spy is not installed")


def child_processes() -> list[str]:
    """Command names of this process's children (from /proc)."""
    names = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == os.getpid():
            names.append(name)
    return names


def assert_seventy_percent(result: ProfileResult, independent: float = 1.0) -> None:
    """hot ~70 % and cold ~30 %, within what the number of samples taken allows.

    The shares are binomial estimates: with n samples their standard error is sqrt(p(1-p)/n),
    so a loaded machine that lets the sampler take fewer samples widens the margin instead of
    failing the test (4 standard errors, never tighter than 10 points).  ``independent`` is the
    share of the samples that are independent draws (a sampler that reads a thread stopped off
    the CPU reads the same place again), so n counts only those.
    """
    assert result.total_samples >= 20, result.table()
    n = max(1.0, result.total_samples * independent)
    margin = max(0.1, 4 * math.sqrt(0.7 * 0.3 / n))
    shares = {f.name: f.total_share for f in result.functions}
    # a sample taken as the call starts or returns may miss the function's own frame
    assert shares.get("workload", 0) >= 0.95, result.table()
    assert abs(shares.get("hot", 0) - 0.7) <= margin, (margin, result.table())
    assert abs(shares.get("cold", 0) - 0.3) <= margin, (margin, result.table())


# -- results ---------------------------------------------------------------------------------------
def test_inprocess_attributes_seventy_percent_to_the_hot_callee() -> None:
    profiler = FunctionProfiler(sampling_rate_hz=400, sample_tags=["unit", "known"])
    # 0.5 s of CPU time (a loaded machine stretches the wall time, not the samples: ~200)
    assert profiler.profile(workload, 0.5, True) == "done"
    result = profiler.profile_result
    assert result is not None and result.backend == "inprocess"
    assert_seventy_percent(result)
    # stacks start at the profiled function: the profiler's own frames are cut
    assert all(stack.startswith("workload (") for stack in result.collapsed)
    assert result.top_self(1)[0].name == "hot"
    assert result.top_total(1)[0].name == "workload"
    assert result.tags == ("unit", "known") and not result.truncated
    assert result.summary()["total_samples"] == result.total_samples
    assert profiler.current_run_id == result.run_id
    assert not any(t.name == SAMPLER_THREAD_NAME for t in threading.enumerate())


@pytest.mark.implementation_independent
@needs_py_spy
@pytest.mark.parametrize("fmt", ["speedscope", "raw"])
def test_py_spy_backend_end_to_end(fmt: str) -> None:
    profiler = FunctionProfiler(backend="py-spy", py_spy_format=fmt, sampling_rate_hz=200)
    # 0.6 s of CPU time: py-spy samples on the wall clock, which load stretches, so enough
    assert profiler.profile(workload, 0.6, True) == "done"
    result = profiler.profile_result
    assert result is not None
    if result.fallback_reason and "ptrace denied" in result.fallback_reason:
        pytest.skip(f"this machine does not let py-spy attach: {result.fallback_reason}")
    assert result.backend == "py-spy" and result.fallback_reason is None
    # py-spy reads the thread on the wall clock: while the thread is off the CPU (a loaded
    # machine; py-spy pausing it to read) its samples repeat where it stopped, so only the
    # share of the time it ran gives independent ones (measured by the workload itself)
    assert_seventy_percent(result, independent=min(1.0, last_cpu_share()))
    assert all(stack.startswith("workload (") for stack in result.collapsed)
    assert "py-spy" not in child_processes()


def test_samples_of_the_profiler_around_the_call_are_left_out_and_counted() -> None:
    builder = TraceBuilder()
    main, anchor = builder.frame("main", "app.py"), builder.frame("profile", "fp.py", 10)
    stacks = {
        "user": [main, anchor, builder.frame("workload", "w.py"), builder.frame("hot", "w.py")],
        "starting": [main, anchor, builder.frame("_open", "fp.py", 50)],
        "in the anchor": [main, anchor],
        "no anchor": [main],
    }
    for weight, frames in enumerate(stacks.values(), 1):
        builder.sample(1, 1, weight, builder.stack(frames), weight)
    trimmed, own = trim_stacks(builder.build(), {("profile", "fp.py")})
    assert own == 2 + 3
    kept = [trimmed.stack_frames(s) for s in trimmed.samples["stack"]]
    assert [names[:1] for names in kept] == [("workload",), ("main",)]


def test_a_stack_cut_at_the_depth_is_told_by_its_time() -> None:
    """Cut at ``stack_max_len``, a stack has lost the profiler's frames: a sample taken before
    the call began or after it returned is the profiler's own (starting, stopping)."""
    builder = TraceBuilder()
    cut = builder.frame(TRUNCATED_FRAME)
    starting = builder.stack([cut, builder.frame("Event.wait", "threading.py")])
    user = builder.stack([cut, builder.frame("hot", "w.py")])
    for ts, stack in ((5, starting), (10, user), (15, user), (20, starting), (25, user)):
        builder.sample(1, 1, ts, stack)
    trace = builder.build()
    trimmed, own = trim_stacks(trace, {("profile", "fp.py")}, call=(10, 20))
    assert own == 2 and list(trimmed.samples["ts_ns"]) == [10, 15, 20]
    assert trim_stacks(trace, {("profile", "fp.py")})[1] == 0  # no call: told by stack only


def test_missing_py_spy_falls_back_to_inprocess(caplog: pytest.LogCaptureFixture) -> None:
    profiler = FunctionProfiler(
        backend="py-spy", py_spy_path="/nonexistent/bin/py-spy", sampling_rate_hz=400
    )
    assert profiler.profile(workload, 0.3) == "done"
    result = profiler.profile_result
    assert result is not None and result.backend == "inprocess"
    assert result.fallback_reason and "/nonexistent/bin/py-spy" in result.fallback_reason
    assert "using the in-process sampler" in caplog.text
    assert result.function("hot").total_samples > 0


def test_missing_py_spy_raises_with_stop_at_error_and_the_function_does_not_run() -> None:
    calls: list[int] = []
    profiler = FunctionProfiler(
        backend="py-spy", py_spy_path="/nonexistent/bin/py-spy", stop_at_error=True
    )
    with pytest.raises(BackendUnavailable, match="does not exist"):
        profiler.profile(calls.append, 1)
    assert calls == [] and profiler.profile_result is None
    assert FunctionProfiler._lock.acquire(blocking=False)  # released after the failure
    FunctionProfiler._lock.release()


def test_py_spy_that_does_not_start_in_time_is_killed_and_replaced(tmp_path: Path) -> None:
    # A stand-in that never reports sampling: the timeout path, whatever the machine's load.
    stuck = tmp_path / "py-spy"
    stuck.write_text("#!/bin/sh\nexec sleep 30\n")
    stuck.chmod(0o755)
    profiler = FunctionProfiler(
        backend="py-spy",
        py_spy_path=str(stuck),
        timeout_wait_for_running_sec=0.2,
        sampling_rate_hz=400,
    )
    profiler.profile(workload, 0.2)
    result = profiler.profile_result
    assert result is not None and result.backend == "inprocess"
    assert result.fallback_reason and "did not start sampling within" in result.fallback_reason
    assert "sleep" not in child_processes()
    strict = FunctionProfiler(
        backend="py-spy",
        py_spy_path=str(stuck),
        timeout_wait_for_running_sec=0.2,
        stop_at_error=True,
    )
    with pytest.raises(FunctionProfilerError, match="did not start sampling"):
        strict.profile(workload, 0.01)
    assert "sleep" not in child_processes()


def test_max_profile_duration_stops_sampling_but_not_the_function() -> None:
    profiler = FunctionProfiler(sampling_rate_hz=400, max_profile_duration_sec=0.15)
    profiler.profile(phases, 0.4, 0.4)
    result = profiler.profile_result
    assert result is not None and result.truncated
    assert result.duration_s >= 0.8
    assert result.function("phase_one").total_samples > 0
    with pytest.raises(KeyError, match="phase_two"):
        result.function("phase_two")


# -- lock, errors, exceptions ---------------------------------------------------------------------
def hold_the_profiler(entered: threading.Event, release: threading.Event) -> str:
    entered.set()
    release.wait(10)
    return "first"


def test_a_concurrent_run_executes_unprofiled_or_raises_with_stop_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entered, release = threading.Event(), threading.Event()
    first = FunctionProfiler(sampling_rate_hz=200)
    results: list[Any] = []
    runner = threading.Thread(
        target=lambda: results.append(first.profile(hold_the_profiler, entered, release))
    )
    runner.start()
    try:
        assert entered.wait(10)
        second = FunctionProfiler()
        calls: list[str] = []

        # the seed returned None here without running the function; we run it unprofiled
        def run() -> str:
            calls.append("ran")
            return "second"

        assert second.profile(run) == "second"
        assert calls == ["ran"] and second.profile_result is None
        assert "concurrent runs are not supported" in caplog.text
        strict = FunctionProfiler(stop_at_error=True)
        with pytest.raises(FunctionProfilerError, match="concurrent runs"):
            strict.profile(calls.append, "strict")
        assert calls == ["ran"]
    finally:
        release.set()
        runner.join(10)
    assert results == ["first"] and first.profile_result is not None
    again = FunctionProfiler(sampling_rate_hz=400)
    again.profile(workload, 0.05)  # the lock was released
    assert again.profile_result is not None


class WorkFailed(Exception):
    pass


def failing_work() -> None:
    workload(0.1, cpu=True)  # 0.1 s on the CPU: ~40 samples at 400 Hz
    raise WorkFailed("boom")


@pytest.mark.parametrize("stop_at_error", [False, True])
def test_the_function_exception_propagates_unchanged_after_the_sampler_stops(
    stop_at_error: bool,
) -> None:
    profiler = FunctionProfiler(sampling_rate_hz=400, stop_at_error=stop_at_error)
    with pytest.raises(WorkFailed, match="boom") as info:
        profiler.profile(failing_work)
    assert info.type is WorkFailed
    assert not any(t.name == SAMPLER_THREAD_NAME for t in threading.enumerate())
    result = profiler.profile_result
    assert result is not None and result.function_raised
    assert result.function("hot").total_samples > 0
    assert FunctionProfiler._lock.acquire(blocking=False)
    FunctionProfiler._lock.release()


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="backend"):
        FunctionProfiler(backend="strobelight")
    with pytest.raises(ValueError, match="sampling_rate_hz"):
        FunctionProfiler(sampling_rate_hz=0)
    with pytest.raises(ValueError, match="timeout_wait_for_running_sec"):
        FunctionProfiler(timeout_wait_for_running_sec=-1)
    with pytest.raises(TypeError, match="sample_tags"):
        FunctionProfiler(sample_tags="one")
    with pytest.raises(ValueError, match="stack_max_len must be at least 1"):
        FunctionProfiler(stack_max_len=0)
    with pytest.raises(TypeError, match="stack_max_len must be an int"):
        FunctionProfiler(stack_max_len=2.5)  # type: ignore[arg-type]  # the error is the test
    with pytest.raises(TypeError, match="callable"):
        FunctionProfiler().profile(42)  # type: ignore[arg-type]  # the error is the test
    assert FunctionProfiler(sample_each=0.004).sampling_rate_hz == pytest.approx(250)


def deep(levels: int, seconds: float) -> str:
    """``workload`` under ``levels`` more frames of this function."""
    return workload(seconds) if levels == 0 else deep(levels - 1, seconds)


def test_stack_max_len_keeps_the_innermost_frames() -> None:
    """strobelight's ``stack_max_len``: a call 20 frames deep, kept to its innermost 4."""
    profiler = FunctionProfiler(sampling_rate_hz=400, stack_max_len=4)
    assert profiler.stack_max_len == 4
    profiler.profile(deep, 20, 0.2)
    result = profiler.profile_result
    assert result is not None and result.total_samples > 0
    # the innermost four of deep x21 > workload > hot or cold, wherever the sample fell
    innermost = re.compile(r"(deep;)*(deep|workload|workload;(hot|cold))")
    for stack in result.collapsed:
        frames = [f.split(" (")[0] for f in stack.split(";")]
        assert frames[0] == TRUNCATED_FRAME and len(frames) == 5, stack
        assert innermost.fullmatch(";".join(frames[1:])), stack


# -- decorator and outputs ------------------------------------------------------------------------
def test_sampled_decorator_with_options_or_a_profiler(tmp_path: Path) -> None:
    @sampled(sampling_rate_hz=400, output_dir=tmp_path)
    def decorated(seconds: float) -> str:
        return workload(seconds)

    assert decorated(0.2) == "done" and decorated.__name__ == "decorated"
    profiler = decorated.profiler  # type: ignore[attr-defined]
    result = profiler.profile_result
    assert result is not None and result.function("hot").total_samples > 0
    assert set(profiler.output_files) == {"collapsed", "speedscope", "flamegraph"}
    assert all(stack.split(" (")[0].endswith("decorated") for stack in result.collapsed)

    shared = FunctionProfiler(sampling_rate_hz=400)
    wrapped = sampled(profiler=shared)(workload)
    wrapped(0.05)
    assert shared.profile_result is not None
    with pytest.raises(TypeError, match="parentheses"):
        sampled(workload)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        sampled(profiler=shared, sampling_rate_hz=10)


def test_outputs_collapsed_speedscope_svg_and_table(tmp_path: Path) -> None:
    profiler = FunctionProfiler(sampling_rate_hz=400)
    profiler.profile(workload, 0.3)
    result = profiler.profile_result
    assert result is not None
    paths = result.write_all(tmp_path / "out", "known")
    lines = paths["collapsed"].read_text().splitlines()
    counts = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines}
    assert sum(counts.values()) == result.total_samples
    assert max(counts, key=counts.__getitem__).endswith(";hot (tests/sampling_workloads.py)")
    doc = json.loads(paths["speedscope"].read_text())
    # titled with the function; weights in milliseconds of sampling (issue 12, point 9)
    assert doc["name"] == f"tests.sampling_workloads.workload (stepscope run {result.run_id})"
    assert {p["unit"] for p in doc["profiles"]} == {"milliseconds"}
    total_ms = sum(sum(p["weights"]) for p in doc["profiles"])
    assert total_ms == pytest.approx(result.total_samples * 1000 / 400)
    frames = {f["name"]: f for f in doc["shared"]["frames"]}
    assert {"workload", "hot", "cold"} <= set(frames)
    first = hot.__code__.co_firstlineno
    # a line of hot: its body, or its ``def`` line when the sample caught the call itself
    # (under coverage's tracer a call event runs at the def line long enough to be sampled)
    assert first <= frames["hot"]["line"] <= first + 4
    assert frames["hot"]["file"] == hot.__code__.co_filename
    svg = ET.parse(paths["flamegraph"]).getroot()
    heading = svg.find("{http://www.w3.org/2000/svg}text")
    assert heading is not None and (heading.text or "").startswith(
        f"tests.sampling_workloads.workload (stepscope run {result.run_id}): "
    )
    titles = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("hot (tests/sampling_workloads.py)") for t in titles)
    table = result.table(5)
    assert table.startswith("tests.sampling_workloads.workload: ")
    assert table.splitlines()[2].endswith("hot (tests/sampling_workloads.py)")
    assert f"{result.total_samples} samples" in table


@needs_py_spy
def test_py_spy_binary_is_found_beside_the_interpreter() -> None:
    found = py_spy_binary()
    assert found is not None and Path(found).name == "py-spy"
    assert found == shutil.which("py-spy") or Path(found).parent == Path(sys.executable).parent
