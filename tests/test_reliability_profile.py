"""The profiler after fork and with reserved metadata keys (issue 13, points 6 and 7; Low)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope import profile, record_function, trace_handler
from stepscope._ext import native
from stepscope.collectors.annotations import is_recording
from stepscope.profiler.profile import active_profile
from stepscope.trace import read_chrome_trace


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total += leaf(i)
    return total


def leaf(i: int) -> int:
    return i & 7


def best_of(runs: int, n: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        work(n)
        best = min(best, time.perf_counter() - start)
    return best


def tracer_active() -> bool:
    mod = native()
    return bool(mod is not None and mod._tracer_active())


def in_child(fn: Any) -> dict[str, Any]:
    """Fork, run ``fn`` in the child, return what it reported (a JSON object)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        try:
            report = fn()
        except BaseException as exc:
            report = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    result: dict[str, Any] = json.loads(b"".join(chunks))
    assert "error" not in result, result["error"]
    return result


@pytest.mark.slow
def test_a_child_forked_mid_window_starts_clean(tmp_path: Path) -> None:
    n = 20_000
    with profile(with_stack=True) as prof:  # recording from the first step
        with record_function("parent_block"):
            traced = best_of(3, n)
            assert is_recording()
            assert tracer_active() == (native() is not None)

            def child() -> dict[str, Any]:
                report: dict[str, Any] = {
                    "active_profile": active_profile() is not None,
                    "annotations_recording": is_recording(),
                    "tracer_active": tracer_active(),
                    "untraced_s": best_of(3, n),
                }
                prof.step()  # the parent's profile does nothing in the child
                with profile(with_stack=True) as own, record_function("child_block"):
                    work(10)
                path = tmp_path / f"child-{os.getpid()}.json"
                own.export_chrome_trace(path)
                names = {s.name for s in own.events()}
                report["own_has_child_block"] = "child_block" in names
                report["own_has_parent_block"] = "parent_block" in names
                report["own_traced_leaf"] = any(n.endswith(": leaf") for n in names)
                return report

            report = in_child(child)
        prof.step()
    assert report["active_profile"] is False
    assert report["annotations_recording"] is False
    assert report["tracer_active"] is False
    assert report["own_has_child_block"] and report["own_traced_leaf"]
    assert not report["own_has_parent_block"]
    untraced_here = best_of(3, n)
    # the child runs at the untraced speed: nearer the parent's untraced time than its traced
    # one (tracing costs 2-5x; a ratio, not a time, so a loaded machine does not fail it)
    timings = (report["untraced_s"], traced, untraced_here)
    assert abs(report["untraced_s"] - untraced_here) < abs(report["untraced_s"] - traced), timings
    names = {s.name for s in prof.events()}
    assert "parent_block" in names  # the parent's window is whole


def test_a_reserved_metadata_key_is_refused_when_added(tmp_path: Path) -> None:
    with profile(on_trace_ready=trace_handler(tmp_path)) as prof:
        for key in ("samples", "traceEvents", "stackFrames", "schemaVersion"):
            with pytest.raises(ValueError, match=f"metadata key '{key}' is reserved"):
                prof.add_metadata(key, "x")
            with pytest.raises(ValueError, match="reserved"):
                prof.add_metadata_json(key, "1")
        prof.add_metadata("my_samples", "x")
        prof.step()
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    assert read_chrome_trace(files[0]).metadata["my_samples"] == "x"


def test_max_annotation_spans_is_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="max_spans must be an int in"):
        profile(max_annotation_spans=10**30)


def sigprof_caught() -> bool:
    """Whether this process has a handler for SIGPROF (the kernel's view, not Python's)."""
    with open("/proc/self/status") as fh:
        mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    return bool(mask >> (signal.SIGPROF - 1) & 1)


def test_a_child_forked_while_sampling_starts_clean_and_samples_on_its_own() -> None:
    with profile(activities=["CPU", "SAMPLING"], sampling_rate_hz=500) as prof:
        work(2000)

        def child() -> dict[str, Any]:
            before = sigprof_caught()  # as the parent's run left it
            with profile(activities=["CPU", "SAMPLING"], sampling_rate_hz=1000) as own:
                # 0.1 s of this thread's CPU time, however long a loaded machine makes it: the
                # sampler's ticks reach a running thread, ~100 samples at 1000 Hz
                spent = time.thread_time() + 0.1
                deadline = time.perf_counter() + 30
                while time.thread_time() < spent and time.perf_counter() < deadline:
                    work(200)
            info = own.trace().metadata["stepscope_sampler"]
            return {
                "caught_at_start": before,
                "samples": len(own.trace().samples),
                "mode": info.get("mode"),
                "caught_after": sigprof_caught(),
            }

        report = in_child(child)
        work(2000)
    assert report["samples"] > 20, report
    assert not report["caught_at_start"] and not report["caught_after"], report
    if native() is not None and sys.version_info >= (3, 11):
        assert report["mode"] == "signal", report
    assert len(prof.trace().samples) > 0


def test_a_start_that_raises_leaves_the_process_able_to_profile(tmp_path: Path) -> None:
    from stepscope.collectors.base import WindowContext
    from stepscope.collectors.python import PythonTracerCollector

    with pytest.raises(TypeError, match=r"schedule\(0\) returned 1"):
        profile(schedule=lambda step: 1)  # type: ignore[arg-type,return-value]
    holder = PythonTracerCollector()  # holds the function tracer: the profile's cannot claim it
    holder.prepare(WindowContext(window=0))
    try:
        failing = profile(with_stack=True, torch_ops=False, strict=True)
        with pytest.raises(Exception, match="tracer"):
            failing.start()
        assert active_profile() is None
    finally:
        holder.close()
    with profile(on_trace_ready=trace_handler(str(tmp_path)), torch_ops=False) as prof:
        with record_function("after"):
            pass
        prof.step()
    [written] = tmp_path.glob("*.json")
    assert "after" in {s.name for s in read_chrome_trace(written).iter_spans()}
