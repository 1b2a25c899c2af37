"""The memory section of a trace stepscope wrote on an H200 (tests/fixtures/traces/README.md),
against what the program read from torch.cuda at each step end on that machine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rich.console import Console

from stepscope.analysis.memory import cuda_allocator_notes, memory_summary
from stepscope.analysis.memory_types import MemoryStep
from stepscope.report.memory import memory_renderables
from stepscope.trace.chrome_reader import read_chrome_trace

FIXTURE = Path(__file__).parent / "fixtures" / "traces" / "h200_memory_leak.pt.trace.json.gz"
MIB = 1 << 20
ALLOCATED_AT_STEP_2 = 90_362_880
RESERVED = {2: 132_120_576, 4: 134_217_728, 6: 136_314_880, 8: 138_412_032}


def test_the_allocator_rows_and_tensor_figures_equal_the_programs_readings(tmp_path: Path) -> None:
    path = tmp_path / FIXTURE.name
    shutil.copy(FIXTURE, path)
    summary = memory_summary(read_chrome_trace(path))
    assert summary is not None
    assert [s.step for s in summary.steps] == list(range(2, 10))
    for s in summary.steps:
        allocated = ALLOCATED_AT_STEP_2 + (s.step - 2) * MIB
        assert s.cuda_allocator["allocated"] == allocated
        assert s.tensor_current["cuda:0"] == allocated  # torch's events agree with its allocator
        assert s.cuda_allocator["reserved"] == RESERVED[s.step - s.step % 2]
        assert s.tensor_peak["cuda:0"] >= allocated
    leak = next(h for h in summary.leaks if h.kind == "cuda:0")
    assert leak.per_step_bytes == MIB and leak.steps == 8
    assert leak.sites[0].function == "aten::empty"  # the op the program called
    assert not cuda_allocator_notes(summary.steps)  # no retries, no OOMs in that run


def test_the_terminal_table_shows_allocated_and_reserved(tmp_path: Path) -> None:
    path = tmp_path / FIXTURE.name
    shutil.copy(FIXTURE, path)
    summary = memory_summary(read_chrome_trace(path))
    with open(os.devnull, "w") as sink:
        console = Console(width=160, record=True, file=sink)
        for part in memory_renderables(summary):
            console.print(part)
    text = console.export_text()
    assert "cuda allocated" in text and "cuda reserved" in text
    assert "86.2 MiB" in text and "126.0 MiB" in text  # step 2: 90,362,880 and 132,120,576 bytes


def test_retries_and_ooms_are_noted_with_their_count_in_the_window() -> None:
    steps = [
        MemoryStep(1, cuda_allocator={"alloc_retries": 2, "ooms": 0}),
        MemoryStep(2, cuda_allocator={"alloc_retries": 5, "ooms": 1}),
    ]
    notes = cuda_allocator_notes(steps)
    assert len(notes) == 2
    assert notes[0].startswith("CUDA: 5 allocation(s) retried") and "3 after the first" in notes[0]
    assert "1 out-of-memory error(s)" in notes[1] and "1 after the first" in notes[1]
