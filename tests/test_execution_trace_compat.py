"""torch's execution trace sees stepscope's annotations, and its ids match stepscope's trace.

The upstream tests (test/profiler/test_execution_trace.py) read as a torch user writes them, with
the import swapped; each behaviour is compared with torch.profiler doing the same in the test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.profiler import ExecutionTraceObserver  # noqa: E402

pytestmark = pytest.mark.slow

ROOTS = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]")
Json = dict[str, Any]


def payload(record_function: Callable[..., Any]) -> None:
    with record_function("## TEST 1 ##", "1, 2, 3"):
        x = torch.randn(6, 6, requires_grad=True)
        y = torch.randn(6, 6, requires_grad=True)
        z = x + y + x * y
        z.backward(z)


def et_nodes(path: Path) -> list[Json]:
    nodes: list[Json] = json.loads(path.read_text())["nodes"]
    return nodes


def rf_id(node: Json) -> int | None:
    return next((a["value"] for a in node["attrs"] if a["name"] == "rf_id"), None)


def et_rf_ids(nodes: list[Json]) -> list[int]:
    ids = (rf_id(n) for n in nodes if n["name"] not in ROOTS)
    return sorted(i for i in ids if i is not None)


def chrome_rf_ids(events: list[Json]) -> list[int]:
    wanted = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    return sorted(e.get("args", {}).get("Record function id", -1) for e in wanted)


def annotated(nodes: list[Json]) -> list[str]:
    return sorted(n["name"] for n in nodes if n["name"].startswith(("## ", "ProfilerStep")))


def profiled_loop(
    folder: Path,
    profile: Any,
    schedule: Any,
    observer: Any,
    record_function: Callable[..., Any],
) -> tuple[list[Json], list[Json]]:
    """upstream test_execution_trace_with_kineto: (ET nodes, Chrome events)."""
    et_path, chrome = folder / "loop.et.json", folder / "loop.chrome.json"
    with profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule(skip_first=3, wait=1, warmup=1, active=2, repeat=1),
        execution_trace_observer=observer().register_callback(str(et_path)),
    ) as prof:
        for idx in range(8):
            with record_function(f"## LOOP {idx} ##"):
                payload(record_function)
            prof.step()
    prof.export_chrome_trace(str(chrome))
    events: list[Json] = json.loads(chrome.read_text())["traceEvents"]
    return et_nodes(et_path), events


def test_profile_execution_trace_matches_torchs(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "ours").mkdir()
    torch_nodes, torch_events = profiled_loop(
        tmp_path / "torch",
        torch.profiler.profile,
        torch.profiler.schedule,
        torch.profiler.ExecutionTraceObserver,
        torch.profiler.record_function,
    )
    nodes, events = profiled_loop(
        tmp_path / "ours",
        stepscope.profile,
        stepscope.schedule,
        ExecutionTraceObserver,
        stepscope.record_function,
    )
    # the same annotated nodes: two loops, their payload blocks and their steps
    assert annotated(nodes) == annotated(torch_nodes)
    assert sum(n["name"].startswith("## LOOP") for n in nodes) == 2
    assert any(n["name"] == ROOTS[0] for n in nodes)
    # ids match across the two files, as torch's do
    assert et_rf_ids(torch_nodes) == chrome_rf_ids(torch_events)
    assert et_rf_ids(nodes) == chrome_rf_ids(events)
    by_id = {rf_id(n): n["name"] for n in nodes}
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 2
    for step in steps:  # ProfilerStep#N is the ET node of the same record function id
        assert by_id[step["args"]["Record function id"]] == step["name"]


@pytest.mark.parametrize("observer", ["torch", "stepscope"])
def test_annotations_are_nodes_with_either_observer(tmp_path: Path, observer: str) -> None:
    """upstream test_execution_trace_start_stop, without a profile."""
    make = torch.profiler.ExecutionTraceObserver if observer == "torch" else ExecutionTraceObserver
    et_path = tmp_path / "et.json"
    et = make()
    et.register_callback(str(et_path))
    expected = 0
    for idx in range(8):
        if idx in (2, 6):
            et.start()
        elif idx in (4, 7):
            et.stop()
        if et._execution_trace_running:  # as torch's test reads it
            expected += 1
        with stepscope.record_function(f"## LOOP {idx} ##"):
            payload(stepscope.record_function)
    et.unregister_callback()
    nodes = et_nodes(et_path)
    assert sum(n["name"].startswith("## LOOP") for n in nodes) == expected == 3
    # the args string reaches torch's node, as torch's record_function gives it
    (test_node, *_) = [n for n in nodes if n["name"] == "## TEST 1 ##"]
    assert test_node["inputs"]["values"] == ["1, 2, 3"]


def test_environment_variable_builds_the_observer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("ENABLE_PYTORCH_EXECUTION_TRACE", "1")
    monkeypatch.setenv("ENABLE_PYTORCH_EXECUTION_TRACE_EXTRAS", "1")
    # one at a time: torch keeps a single execution trace observer per process
    for make in (torch.profiler.profile, stepscope.profile):
        prof = make()
        observer = prof.execution_trace_observer
        assert observer is not None and observer.is_registered
        resources = observer.get_resources_dir()
        assert resources == observer.get_output_file_path().replace(".et.json", ".et_resources")
        assert Path(resources).is_dir()
        with prof, stepscope.record_function("## env ##"):
            torch.ones(3).sum()
        path = Path(observer.get_output_file_path())
        assert "## env ##" in {n["name"] for n in et_nodes(path)}
    monkeypatch.delenv("ENABLE_PYTORCH_EXECUTION_TRACE")
    assert stepscope.profile().execution_trace_observer is None


def test_args_string_reaches_torchs_profiler() -> None:
    """A stepscope block inside torch's profiler has torch's input_shapes ([[]] for its args)."""

    def shapes(record_function: Callable[..., Any]) -> list[Any]:
        with (
            torch.profiler.profile(record_shapes=True) as prof,
            record_function("## user ##", "a, b"),
        ):
            torch.ones(2).sum()
        (event,) = [e for e in prof.events() if e.name == "## user ##"]
        return list(event.input_shapes)

    assert shapes(stepscope.record_function) == shapes(torch.profiler.record_function) == [[]]
