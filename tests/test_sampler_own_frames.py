"""A profiler's own frames never appear in results: a sample taken while stepscope's code runs
the standard library for itself (its sampler's start waiting in ``Condition.wait``: 11.8 ms of
pyperformance richards shown as the program's) is stepscope's own work (issue 36, item 7)."""

from __future__ import annotations

import json
import runpy
import threading
import time
from array import array
from types import CodeType

import pytest

import stepscope
from stepscope.collectors.sampler import Sampler, SamplerData, add_samples
from stepscope.jsonenc import json_bytes
from stepscope.program import Program
from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import OWN_WORK_FRAME
from stepscope.trace.stacks import collapsed_from_samples


def user_caller() -> None:
    """Stands for the program's function that called stepscope."""


def user_callback() -> None:
    """Stands for the program's function that stepscope's wrapper calls."""


STEPSCOPE_START = Sampler.start.__code__
WRAPPER = Program.run.__code__  # stands for any stepscope frame that calls the program
THREAD_START = threading.Thread.start.__code__
EVENT_WAIT = threading.Event.wait.__code__
CONDITION_WAIT = threading.Condition.wait.__code__
JSON_TOOL_MODULE = compile("pass", json.__file__.replace("__init__.py", "tool.py"), "exec")
JSON_DUMPS = json.dumps.__code__
RUN_CODE = runpy._run_code.__code__  # type: ignore[attr-defined]


def collapsed(*stacks: tuple[CodeType, ...]) -> dict[str, int]:
    """The collapsed stacks of one sample of each stack (root first) on one thread."""
    codes: list[CodeType | None] = []
    frame_code, frame_line = array("i"), array("i")
    stack_parent, stack_frame = array("i"), array("i")
    sample_stack = array("i")
    for stack in stacks:
        parent = -1
        for code in stack:
            if code not in codes:
                codes.append(code)
            frame_code.append(codes.index(code))
            frame_line.append(code.co_firstlineno)
            stack_frame.append(len(frame_code) - 1)
            stack_parent.append(parent)
            parent = len(stack_frame) - 1
        sample_stack.append(parent)
    n = len(stacks)
    data = SamplerData(
        codes=codes,
        frame_code=frame_code,
        frame_line=frame_line,
        stack_parent=stack_parent,
        stack_frame=stack_frame,
        sample_tid=array("q", [1] * n),
        sample_ts=array("q", range(1000, 1000 + 1000 * n, 1000)),
        sample_stack=sample_stack,
        sample_idle=array("B", [0] * n),
        dropped=0,
        ticks=n,
        busy_ns=0,
    )
    b = TraceBuilder(base_time_ns=0)
    add_samples(b, data, 1)
    return {k.replace(__file__, "test"): v for k, v in collapsed_from_samples(b.build()).items()}


def leaves(result: dict[str, int]) -> list[str]:
    return [k.split(";")[-1] for k in result]


def test_the_samplers_start_waiting_for_its_thread_is_stepscopes_own_work() -> None:
    got = collapsed(
        (user_caller.__code__, STEPSCOPE_START, THREAD_START, EVENT_WAIT, CONDITION_WAIT)
    )
    assert len(got) == 1, got
    (stack,) = got
    assert stack.split(";")[-1] == OWN_WORK_FRAME, got
    assert stack.split(";")[0].startswith("user_caller ("), got
    assert "threading" not in stack and "wait" not in stack, got


def test_stdlib_frames_between_stepscopes_own_frames_are_its_work_too() -> None:
    got = collapsed(
        (user_caller.__code__, WRAPPER, THREAD_START, STEPSCOPE_START, EVENT_WAIT, CONDITION_WAIT)
    )
    assert [k.split(";") for k in got] == [[next(iter(got)).split(";")[0], OWN_WORK_FRAME]], got


def test_the_programs_own_waits_under_a_stepscope_wrapper_stay_the_programs() -> None:
    got = collapsed((WRAPPER, user_callback.__code__, EVENT_WAIT, CONDITION_WAIT))
    assert leaves(got) == ["Condition.wait (threading.py)"], got
    assert next(iter(got)).startswith("user_callback ("), got


@pytest.mark.parametrize(
    "launcher",
    [(WRAPPER,), (WRAPPER, RUN_CODE)],
    ids=["stepscope-runs-the-module", "runpy-runs-the-module"],
)
def test_a_standard_library_program_is_the_program(launcher: tuple[CodeType, ...]) -> None:
    """``stepscope run -m json.tool``: the program is all standard library, and its time is
    its own."""
    got = collapsed((*launcher, JSON_TOOL_MODULE, JSON_DUMPS))
    assert leaves(got) == ["dumps (json/__init__.py)"], got


def _stepscope_encodes_json(seconds: float) -> None:
    """Calls stepscope's own code that spends its time in the standard library's json."""
    value = {"rows": [{"name": f"f{i}", "ns": i, "ok": True} for i in range(2000)]}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        json_bytes(value, pretty_separators=True)  # json.dumps: the standard library's encoder


def test_stepscopes_time_in_the_standard_library_is_its_own_row() -> None:
    with stepscope.profile(
        activities=["CPU", "SAMPLING"], torch_ops=False, sampling_rate_hz=500
    ) as prof:
        _stepscope_encodes_json(0.4)
    rows = {row.key: row for row in prof.key_averages()}
    json_rows = [k for k in rows if "json/" in k]
    assert not json_rows, json_rows
    caller = next(row for key, row in rows.items() if key.startswith("_stepscope_encodes_json ("))
    own = rows[OWN_WORK_FRAME]
    assert own.self_cpu_time_total > 0.6 * caller.cpu_time_total, (own, caller)
