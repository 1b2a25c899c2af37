"""Readers of torch's trace files read stepscope's: HTA's validator, TensorBoard's plugin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.profiler import ProfilerActivity

torch = pytest.importorskip("torch")


def profiled_files(folder: Path) -> list[Path]:
    """Every kind of file a profile writes: plain and gzipped Chrome traces, with every source."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    activities = [ProfilerActivity.CPU, ProfilerActivity.PYTHON, ProfilerActivity.SAMPLING]
    with stepscope.profile(
        activities=activities,
        schedule=stepscope.schedule(wait=0, warmup=1, active=2),
        on_trace_ready=stepscope.profiler.tensorboard_trace_handler(str(folder / "tb")),
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        with_modules=True,
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
