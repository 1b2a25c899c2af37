"""Readers of torch's trace files read stepscope's: HTA's validator, TensorBoard's plugin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.profiler import ProfilerActivity

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")


def profiled_files(folder: Path) -> list[Path]:
    """Every kind of file a profile writes: plain and gzipped Chrome traces, with every source."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    activities = [ProfilerActivity.CPU, ProfilerActivity.PYTHON, ProfilerActivity.SAMPLING]
    with stepscope.profile(
        activities=activities,
        schedule=stepscope.schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=stepscope.profiler.tensorboard_trace_handler(str(folder / "tb")),
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        with_modules=True,  # with PYTHON: torch's module frames too
        with_stack=True,
    ) as prof:
        for _ in range(3):
            with stepscope.record_function("## step body ##", "1, 2"):
                kept = [bytearray(50_000) for _ in range(4)]
                model(torch.randn(4, 8)).sum().backward()
            del kept
            prof.step()
    prof.export_chrome_trace(folder / "plain.json")
    prof.export_chrome_trace(folder / "zipped.json.gz")
    return sorted(folder.rglob("*.json*"))


def test_hta_validator_accepts_every_file(tmp_path: Path) -> None:
    validate = pytest.importorskip("hta.utils.validate_trace").validate_trace_format
    files = profiled_files(tmp_path)
    assert len(files) >= 3
    for path in files:
        ok, errors = validate(str(path), level="complete")
        assert ok, (path.name, errors)
    events: list[dict[str, Any]] = json.loads((tmp_path / "plain.json").read_text())["traceEvents"]
    heap = [e["args"]["bytes"] for e in events if e.get("ph") == "C" and "bytes" in e["args"]]
    assert heap and all(isinstance(b, int) for b in heap)
    assert any(e.get("name", "").startswith("nn.Module: ") for e in events)  # validated too


def module_tree(stats: Any) -> list[Any]:
    """The Module view's rows without their times: (name, calls, operators, children)."""
    return [
        (row.name, row.occurences, row.operators, module_tree(row.children)) for row in stats or ()
    ]


def tensorboard_views(folder: Path, profile: Any, schedule: Any, handler: Any) -> Any:
    """The views TensorBoard's profiler plugin offers for one profiled window, and the rows of
    its Module view."""
    plugin_data = pytest.importorskip("torch_tb_profiler.profiler.data")
    generator = pytest.importorskip("torch_tb_profiler.profiler.run_generator")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=handler(str(folder)),
        with_modules=True,
        with_stack=True,
    ) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    (path,) = folder.glob("*.pt.trace.json*")
    cache = folder / "cache"
    cache.mkdir()
    data = plugin_data.RunProfileData.parse("worker", None, str(path), str(cache))
    run = generator.RunGenerator("worker", None, data).generate_run_profile()
    return [view.display_name for view in run.views], module_tree(run.module_stats)


def torch_and_stepscope_views(tmp_path: Path) -> tuple[Any, Any]:
    theirs = tensorboard_views(
        tmp_path / "torch",
        torch.profiler.profile,
        torch.profiler.schedule,
        torch.profiler.tensorboard_trace_handler,
    )
    ours = tensorboard_views(
        tmp_path / "ours",
        stepscope.profile,
        stepscope.schedule,
        stepscope.profiler.tensorboard_trace_handler,
    )
    return theirs, ours


def test_tensorboard_plugin_reads_stepscope_files(tmp_path: Path) -> None:
    (their_views, their_modules), (views, modules) = torch_and_stepscope_views(tmp_path)
    assert {"Overview", "Operator", "Trace", "Module"} <= set(views)
    assert set(views) <= set(their_views)
    # the Module view (with_modules and with_stack): the same modules, calls and operators
    assert modules == their_modules
    assert modules[0][0] == "Sequential_0" and len(modules[0][3]) == 3
