"""key_averages() and collapsed stacks on synthetic traces with known durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.profiler.events import Kernel, function_events
from stepscope.profiler.summary import key_averages
from stepscope.report.collapsed import collapsed_from_spans, write_collapsed
from stepscope.trace import Trace, TraceBuilder
from stepscope.trace.nesting import nest_spans

US = 1000


def synthetic() -> Trace:
    """Thread 1: step(0-100us) > fwd(10-60) > mm(20-50); step > bwd(60-95) > mm(70-80).
    Thread 2: mm(0-30).  A kernel on a device stream: 5us."""
    b = TraceBuilder(base_time_ns=0)
    b.span("ProfilerStep#4", "user_annotation", 1, 1, 0, 100 * US)
    b.span("fwd", "user_annotation", 1, 1, 10 * US, 50 * US)
    b.span("aten::mm", "cpu_op", 1, 1, 20 * US, 30 * US, {"Input Dims": [[2, 3], [3, 4]]})
    b.span("bwd", "user_annotation", 1, 1, 60 * US, 35 * US)
    b.span("aten::mm", "cpu_op", 1, 1, 70 * US, 10 * US, {"Input Dims": [[4, 4], [4, 4]]})
    b.span("aten::mm", "cpu_op", 1, 2, 0, 30 * US, {"Input Dims": [[2, 3], [3, 4]]})
    b.span("gemm_kernel", "kernel", 0, 7, 25 * US, 5 * US)
    b.span("PyTorch Profiler (0)", "Trace", "Spans", "PyTorch Profiler", 0, 200 * US)
    return b.build()


def test_nesting_finds_parents_and_self_times() -> None:
    n = nest_spans(synthetic())
    assert list(n.parent[:6]) == [-1, 0, 1, 0, 3, -1]
    assert [v // US for v in n.self_ns[:6]] == [15, 20, 30, 25, 10, 30]


def test_child_running_past_its_parent_counts_only_inside() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("parent", "", 1, 1, 0, 10)
    b.span("child", "", 1, 1, 5, 20)
    n = nest_spans(b.build())
    assert list(n.self_ns) == [5, 20]


def test_key_averages_totals_and_counts() -> None:
    rows = {r.key: r for r in key_averages([synthetic()])}
    assert set(rows) == {"ProfilerStep*", "fwd", "bwd", "aten::mm", "gemm_kernel"}
    mm = rows["aten::mm"]
    # torch's names in torch's unit (µs); the same times in ns under *_ns names
    assert (mm.count, mm.cpu_time_total, mm.self_cpu_time_total) == (3, 70.0, 70.0)
    assert (mm.cpu_time_total_ns, mm.self_cpu_time_total_ns) == (70 * US, 70 * US)
    assert rows["fwd"].self_cpu_time_total == 20 and rows["fwd"].cpu_time_total == 50
    assert rows["ProfilerStep*"].self_cpu_time_total_ns == 15 * US
    assert rows["gemm_kernel"].self_device_time_total == 5
    with pytest.warns(FutureWarning, match="device_time_total"):
        assert rows["gemm_kernel"].self_cuda_time_total == 5
    assert rows["gemm_kernel"].cpu_time_total == 0
    assert mm.cpu_time == pytest.approx(70 / 3)
    assert mm.cpu_time_ns == pytest.approx(70 * US / 3)


def test_group_by_input_shape_splits_rows() -> None:
    rows = key_averages([synthetic()], group_by_input_shape=True)
    mm = sorted((r.input_shapes, r.count) for r in rows if r.key == "aten::mm")
    assert mm == [([[2, 3], [3, 4]], 2), ([[4, 4], [4, 4]], 1)]  # torch's lists
    assert "Input Shapes" in rows.table()


def test_group_by_stack_uses_enclosing_python_functions() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("train.py(3): step", "python_function", 1, 1, 0, 100)
    b.span("model.py(9): forward", "python_function", 1, 1, 10, 50)
    b.span("aten::mm", "cpu_op", 1, 1, 20, 10)
    b.span("aten::mm", "cpu_op", 1, 1, 70, 10)
    rows = key_averages([b.build()], group_by_stack_n=1)
    stacks = sorted((r.stack, r.count) for r in rows if r.key == "aten::mm")
    assert stacks == [(["model.py(9): forward"], 1), (["train.py(3): step"], 1)]
    assert "Source Location" in rows.table()
    with pytest.raises(ValueError, match="zero or more"):
        key_averages([b.build()], group_by_stack_n=-1)


def test_table_has_torch_columns_and_sorts() -> None:
    avg = key_averages([synthetic()])
    table = avg.table(sort_by="self_cpu_time_total", row_limit=10)
    lines = table.splitlines()
    header = lines[1]
    for column in (
        "Name",
        "Self CPU %",
        "Self CPU",
        "CPU total %",
        "CPU total",
        "CPU time avg",
        "Self CUDA",
        "CUDA total",
        "# of Calls",
    ):
        assert column in header
    assert lines[3].split()[0] == "aten::mm"
    assert lines[-2] == "Self CPU time total: 130.000us"
    assert lines[-1] == "Self CUDA time total: 5.000us"
    assert "70.000us" in lines[3] and "53.85%" in lines[3]
    for key in (
        "self_cuda_time_total",
        "self_device_time_total",
        "cuda_time_total",
        "device_time",
        "count",
        "cpu_time",
    ):
        avg.table(sort_by=key)
    assert avg.sorted_rows("self_device_time_total")[0].key == "gemm_kernel"
    assert avg.table(row_limit=1).count("\n") == 7  # 3 header lines, 1 row, rule, 2 totals
    with pytest.raises(ValueError, match="valid keys"):
        avg.table(sort_by="wall")
    assert avg.table(sort_by="self_cpu_memory_usage")  # memory is recorded now


def test_to_rows_for_programs() -> None:
    rows = key_averages([synthetic()]).to_rows(sort_by="count")
    assert rows[0]["name"] == "aten::mm" and rows[0]["count"] == 3
    assert rows[0]["self_cpu_time_total_ns"] == 70 * US


def test_collapsed_stacks_hold_self_times_in_microseconds(tmp_path: Path) -> None:
    stacks = collapsed_from_spans([synthetic()])
    assert stacks == {
        "ProfilerStep*": 15,
        "ProfilerStep*;fwd": 20,
        "ProfilerStep*;fwd;aten::mm": 30,
        "ProfilerStep*;bwd": 25,
        "ProfilerStep*;bwd;aten::mm": 10,
        "aten::mm": 30,
    }
    assert collapsed_from_spans([synthetic()], "self_cuda_time_total") == {"gemm_kernel": 5}
    path = tmp_path / "s.txt"
    assert write_collapsed(stacks, path) == 6
    first = path.read_text().splitlines()[0]
    assert first in ("ProfilerStep*;fwd;aten::mm 30", "aten::mm 30")


def test_frame_names_are_made_safe_for_the_format() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("a;b\nc", "", 1, 1, 0, 5000)
    assert collapsed_from_spans([b.build()]) == {"a:b c": 5}


def test_same_named_only_child_is_folded_like_torch() -> None:
    """A dispatcher op wrapping its kernel (aten::mean in aten::mean) counts as one call."""
    b = TraceBuilder(base_time_ns=0)
    b.span("aten::mean", "cpu_op", 1, 1, 0, 100 * US)
    b.span("aten::mean", "cpu_op", 1, 1, 10 * US, 80 * US)
    b.span("aten::sum", "cpu_op", 1, 1, 20 * US, 30 * US)
    b.span("aten::add", "cpu_op", 1, 1, 200 * US, 10 * US)
    b.span("aten::add", "cpu_op", 1, 1, 202 * US, 2 * US)
    b.span("aten::add", "cpu_op", 1, 1, 205 * US, 2 * US)  # two children: not folded
    trace = b.build()
    rows = {r.key: r for r in key_averages([trace])}
    assert rows["aten::mean"].count == 1
    assert rows["aten::mean"].cpu_time_total == 100
    assert rows["aten::mean"].self_cpu_time_total_ns == 70 * US
    assert rows["aten::add"].count == 3
    stacks = collapsed_from_spans([trace])
    assert stacks["aten::mean"] == 70 and "aten::mean;aten::mean" not in stacks


def test_kernels_count_for_the_op_that_launched_them_as_in_torch() -> None:
    """A kernel carries its op's ``External id``: its time is the op's device time, and the
    enclosing op's total device time, as torch's event tree counts it."""
    b = TraceBuilder(base_time_ns=0)
    b.span("aten::linear", "cpu_op", 1, 1, 0, 50 * US, {"External id": 1})
    b.span("aten::addmm", "cpu_op", 1, 1, 10 * US, 30 * US, {"External id": 2})
    b.span("cudaLaunchKernel", "cuda_runtime", 1, 1, 20 * US, 5 * US, {"correlation": 9})
    b.span("gemm", "kernel", 0, 7, 60 * US, 8 * US, {"External id": 2, "device": 0, "stream": 7})
    trace = b.build()
    rows = {r.key: r for r in key_averages([trace], use_device="cuda")}
    assert rows["aten::addmm"].self_device_time_total == 8
    assert rows["aten::addmm"].device_time_total == 8
    assert rows["aten::linear"].device_time_total == 8
    assert rows["aten::linear"].self_device_time_total == 0
    assert rows["gemm"].device_time_total == 8 and rows["gemm"].on_device
    text = key_averages([trace], use_device="cuda").table()
    assert "Self CUDA time total: 8.000us" in text  # the kernel counted once
    events = function_events([trace], use_device="cuda")
    addmm = next(e for e in events if e.name == "aten::addmm")
    assert addmm.kernels == [Kernel("gemm", 0, 8.0)]
    assert addmm.cpu_parent is not None and addmm.cpu_parent.name == "aten::linear"
    gemm = next(e for e in events if e.name == "gemm")
    assert gemm.device_type.name == "CUDA" and gemm.cpu_time_total == 0
    assert gemm.device_resource_id == 7
    linear = next(e for e in events if e.name == "aten::linear")
    assert linear.device_time_total == 8 and linear.self_device_time_total == 0


def test_allocations_count_for_the_spans_around_them_and_the_rest_is_a_memory_row() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("aten::ones", "cpu_op", 1, 1, 0, 10 * US)
    b.span("aten::empty", "cpu_op", 1, 1, 1 * US, 2 * US)
    cpu = {"Device Type": 0, "Device Id": -1}
    b.instant("[memory]", "cpu_instant_event", 1, 1, 2 * US, args={"Bytes": 256, **cpu})
    b.instant("[memory]", "cpu_instant_event", 1, 1, 5 * US, args={"Bytes": 64, **cpu})
    b.instant("[memory]", "cpu_instant_event", 1, 1, 20 * US, args={"Bytes": -256, **cpu})
    trace = b.build()
    rows = {r.key: r for r in key_averages([trace], profile_memory=True)}
    assert (rows["aten::ones"].cpu_memory_usage, rows["aten::ones"].self_cpu_memory_usage) == (
        320,
        64,
    )
    assert rows["aten::empty"].cpu_memory_usage == 256
    assert (rows["[memory]"].count, rows["[memory]"].cpu_memory_usage) == (1, -256)
    assert "[memory]" not in {r.key for r in key_averages([trace])}  # only with profile_memory
    events = function_events([trace], profile_memory=True)
    assert [(e.name, e.cpu_memory_usage) for e in events] == [
        ("aten::ones", 320),
        ("aten::empty", 256),
        ("[memory]", -256),
    ]
    assert "Self CPU Mem" in key_averages([trace], profile_memory=True).table()
