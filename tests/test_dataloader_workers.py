"""DataLoader workers without worker processes: the channel, the analysis, the advice, the hooks.

The tests with worker processes (fork, spawn, a killed worker, ``stepscope run``) are in
``test_dataloader_workers_real.py`` (slow).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, dataloader
from torch.utils.data._utils import worker as torch_worker

import stepscope
from stepscope.analysis.analyze import analyze_trace
from stepscope.analysis.data_workers import JUST_IN_TIME_NS
from stepscope.cli import build_parser
from stepscope.collectors.dataloader_hooks import HUB
from stepscope.collectors.dataloader_ring import (
    F_COLLATE_END,
    F_COLLATE_START,
    F_CPU_COLLATE_END,
    F_CPU_COLLATE_START,
    KIND_BATCH,
    Channel,
    WorkerSlot,
)
from stepscope.collectors.dataloader_workers import DataLoaderWorkersCollector
from stepscope.commands.run import _profile, check_values
from stepscope.profiler.options import RecordingOptions
from stepscope.report.terminal import render_summary, report_console
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.worker_tracks import (
    CONSUMED_INSTANT,
    LOOP_TRACK_BASE,
    METADATA_KEY,
    WORKER_CATEGORY,
)
from tests.dataloader_programs import TimedDataset, run_loop

MS = 1_000_000
BASE = 10**12


# -- the channel ----------------------------------------------------------------------------
def test_a_worker_region_holds_the_latest_records_and_counts_the_rest() -> None:
    channel = Channel(2, slots=4)
    slot = WorkerSlot(channel.path, 1)
    try:
        assert not slot.armed
        channel.arm(True)
        channel.sample(3, 250.0)
        assert slot.armed and slot.sampling == (3, 250.0)
        for batch in range(6):
            slot.begin(0, batch, BASE + batch * MS)
            slot.mark(F_COLLATE_START, F_CPU_COLLATE_START, BASE + batch * MS + 600_000)
            slot.mark(F_COLLATE_END, F_CPU_COLLATE_END, BASE + batch * MS + 900_000)
            slot.end(KIND_BATCH, BASE + batch * MS + 950_000)
        slot.begin(0, 6, BASE + 6 * MS)
        records = channel.read(1)
        assert [r.batch for r in records] == [2, 3, 4, 5]  # 4 slots: the first two overwritten
        assert channel.dropped == 2
        assert channel.read(0) == [] and channel.read(1) == []
        last = records[-1]
        assert (last.start_ns, last.collate_start_ns, last.end_ns) == (
            BASE + 5 * MS,
            BASE + 5 * MS + 600_000,
            BASE + 5 * MS + 950_000,
        )
        assert last.dataset_end_ns == last.collate_start_ns
        assert last.dataset_cpu_ns >= 0 and last.collate_cpu_ns >= 0
        current = channel.in_progress(1)
        assert current is not None and current.batch == 6 and current.end_ns == 0
        assert channel.in_progress(0) is None
        assert channel.worker_word(1, 0) == os.getpid()  # R_PID
    finally:
        slot.close()
        channel.close()
    assert not Path(channel.directory).exists()


def test_a_worker_refuses_a_file_that_is_no_channel(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(bytes(4096))
    with pytest.raises(ValueError, match="not a stepscope DataLoader channel"):
        WorkerSlot(str(other), 0)
    channel = Channel(1, slots=2)
    try:
        with pytest.raises(ValueError, match="worker 3 has no region"):
            WorkerSlot(channel.path, 3)
    finally:
        channel.close()


# -- the analysis on a trace made by hand ----------------------------------------------------
def made_by_hand(
    batches: Sequence[tuple[int, int, float, float]], asked: Sequence[tuple[int, float, float]]
) -> Trace:
    """Four 10 ms steps; ``batches``: (worker, batch, start ms, end ms) with the dataset part
    the first 80 %; ``asked``: (batch, asked ms, waited ms), the batch's worker from above."""
    b = TraceBuilder(base_time_ns=0)
    pid = 1
    for step in range(4):
        b.span(f"ProfilerStep#{step}", "user_annotation", pid, pid, BASE + step * 10 * MS, 10 * MS)
    made = {}
    for worker, batch, start, end in batches:
        tid = 100 + worker
        made[batch] = worker
        dur = int((end - start) * MS)
        args = {"loader": 1, "iterator": 1, "worker": worker, "epoch": 0, "batch": batch}
        args |= {"dataset_ns": dur * 8 // 10, "dataset_cpu_ns": dur // 2, "collate_ns": dur // 5}
        b.span(f"batch {batch}", WORKER_CATEGORY, pid, tid, BASE + int(start * MS), dur, args)
    for batch, at, waited in asked:
        args = {"loader": 1, "iterator": 1, "epoch": 0, "batch": batch, "worker": made[batch]}
        args["wait_ns"] = int(waited * MS)
        b.instant(CONSUMED_INSTANT, WORKER_CATEGORY, pid, pid, BASE + int(at * MS), "t", args)
    # samples of worker 0 inside its batch 2's dataset part (1..15.4 ms): decode 3, load 1
    decode = b.stack([b.frame("getitem", "/data/ds.py", 3), b.frame("decode", "/data/ds.py", 9)])
    load = b.stack([b.frame("getitem", "/data/ds.py", 3), b.frame("load", "/data/ds.py", 20)])
    for at, stack in ((2, decode), (5, decode), (9, decode), (12, load), (17, load)):
        b.sample(pid, 100, BASE + at * MS, stack)
    b.metadata[METADATA_KEY] = [
        {
            "loader": 1,
            "iterator": 1,
            "num_workers": 2,
            "prefetch_factor": 2,
            "pin_memory": False,
            "persistent_workers": False,
            "dataset": "Images",
            "workers": [{"worker": 0, "pid": 100}, {"worker": 1, "pid": 101}],
        }
    ]
    return b.build()


BATCHES = [(0, 0, -5, 1), (1, 1, -5, 5), (0, 2, 1, 19), (1, 3, 5, 33)]
ASKED = [(0, 0.5, 0.6), (1, 10.5, 0.1), (2, 20.5, 0.1), (3, 30.5, 2.6)]


def test_each_step_gets_its_batch_worker_readiness_and_split() -> None:
    summary = analyze_trace(made_by_hand(BATCHES, ASKED))
    assert summary.data_workers is not None
    (loader,) = summary.data_workers.loaders
    rows = loader.steps
    assert [(r.step, r.batch, r.worker, r.worker_pid) for r in rows] == [
        (0, 0, 0, 100),
        (1, 1, 1, 101),
        (2, 2, 0, 100),
        (3, 3, 1, 101),
    ]
    assert [r.margin_ns for r in rows] == [-MS // 2, 55 * MS // 10, 15 * MS // 10, -25 * MS // 10]
    assert [r.status for r in rows] == ["just_in_time", "ahead", "ahead", "late"]
    assert JUST_IN_TIME_NS == MS
    assert [r.ready_ahead for r in rows] == [0, 1, 1, 0]
    assert rows[3].transfer_ns == MS // 10  # asked 30.5 + waited 2.6 - done at 33
    assert rows[2].dataset_ns == 18 * MS * 8 // 10 and rows[2].dataset_cpu_ns == 9 * MS
    assert (loader.ahead, loader.just_in_time, loader.late) == (2, 1, 1)
    assert loader.wait_ns == int(3.4 * MS)
    # busy over the steps' 40 ms: worker 0 1 + 18 ms, worker 1 5 + 28 ms
    assert [(w.worker, w.batches, round(w.busy_pct, 3)) for w in loader.workers] == [
        (0, 2, 47.5),
        (1, 2, 82.5),
    ]
    # samples inside worker 0's dataset parts: decode 3 of 4 (the one at 17 ms is collate)
    assert [(f.name, f.self_samples, f.total_samples) for f in loader.functions] == [
        ("decode (/data/ds.py)", 3, 3),
        ("load (/data/ds.py)", 1, 1),
    ]
    assert loader.functions[0].self_pct == 75.0
    # the workers' samples are not the program's own Python
    assert not [f for f in summary.functions if "decode" in f.name]
    assert summary.to_dict()["data_workers"]["loaders"][0]["steps"][3]["status"] == "late"


def test_the_advice_names_each_worker_and_what_would_help() -> None:
    summary = analyze_trace(made_by_hand(BATCHES, ASKED))
    (advice,) = [r for r in summary.recommendations if r.rule == "data_loading"]
    assert "1 of 4 late" in advice.title
    assert "workers 0 (pid 100) and 1 (pid 101) are busy 47.5 % and 82.5 % of the time" in (
        advice.advice
    )
    assert "more workers will not help" in advice.advice
    assert "prefetch_factor (now 2)" in advice.advice
    assert "decode (/data/ds.py) takes 75% of the workers' samples" in advice.advice
    # both busy: more workers
    busy = [(0, 0, -5, 1), (1, 1, -5, 5), (0, 2, 1, 38), (1, 3, 5, 39)]
    summary = analyze_trace(
        made_by_hand(busy, [(0, 0.5, 0.6), (1, 10.5, 0.1), (2, 20.5, 18), (3, 39.5, 0.1)])
    )
    (advice,) = [r for r in summary.recommendations if r.rule == "data_loading"]
    assert "raise num_workers from 2 to 4" in advice.advice
    assert advice.evidence["workers_busy_pct"] == {"0": 95.0, "1": 97.5}  # 38, 39 of 40 ms


def test_no_advice_when_every_batch_was_ready() -> None:
    ready = [(0, 0, -5, -1), (1, 1, -5, 5), (0, 2, -1, 19), (1, 3, 5, 28)]
    summary = analyze_trace(
        made_by_hand(ready, [(0, 0.5, 1), (1, 10.5, 1), (2, 20.5, 1), (3, 30.5, 1)])
    )
    assert summary.data_workers is not None
    assert {r.status for r in summary.data_workers.loaders[0].steps} == {"ahead"}
    assert not [r for r in summary.recommendations if r.rule == "data_loading"]


def test_the_section_is_rendered() -> None:
    console = report_console()
    with console.capture() as captured:
        console.print(render_summary(analyze_trace(made_by_hand(BATCHES, ASKED))))
    text = captured.get()
    assert "DataLoader 1 (Images; num_workers=2, prefetch_factor=2, pin_memory=False" in text
    assert "batches taken by 4 steps: 2 ahead, 1 just in time, 1 late" in text
    assert "slowest dataset functions (4 worker samples)" in text


# -- a real loader without workers, in this process ------------------------------------------
def test_a_loader_without_workers_records_each_batch_in_the_loop() -> None:
    loader = DataLoader(TimedDataset(12, 30_000), batch_size=2, num_workers=0)
    with stepscope.profile(activities=["CPU"], torch_ops=False) as prof:
        logged = run_loop(loader, prof)
    trace = prof.trace()
    names = trace.thread_names()
    assert names[(os.getpid(), LOOP_TRACK_BASE + 1)].startswith("DataLoader 1: batches made")
    summary = analyze_trace(trace)
    assert summary.data_workers is not None
    (report,) = summary.data_workers.loaders
    assert report.settings["num_workers"] == 0
    truth = attributed = 0
    for row in report.steps:
        assert row.step is not None and row.batch == row.step
        assert (row.worker, row.status) == (-1, "in_loop")
        own = logged.cpu_ns(row.step)
        assert row.dataset_cpu_ns is not None and row.collate_ns is not None
        truth += own
        attributed += min(own, row.dataset_cpu_ns)
        assert row.wait_ns >= (row.dataset_ns or 0)  # the loop made it while the step waited
    assert len(report.steps) == len(logged.steps) and attributed >= 0.95 * truth
    keys = {row.key for row in prof.key_averages()}
    assert not {k for k in keys if k.startswith("batch ")} | (keys & {"dataset", "collate"})


def test_the_hooks_are_put_back_and_the_switch_leaves_torch_alone() -> None:
    multi: Any = dataloader._MultiProcessingDataLoaderIter
    before = (multi.__dict__["__init__"], multi.__dict__["_next_data"], torch_worker._worker_loop)
    with stepscope.profile(activities=["CPU"], torch_ops=False, dataloader_workers=False) as prof:
        assert (multi.__dict__["__init__"], torch_worker._worker_loop) == (before[0], before[2])
        assert not any(isinstance(c, DataLoaderWorkersCollector) for c in prof.collectors)
    with stepscope.profile(activities=["CPU"], torch_ops=False):
        assert multi.__dict__["__init__"] is not before[0]
        assert type(torch_worker._worker_loop).__name__ == "HookedWorkerLoop"
    assert (
        multi.__dict__["__init__"],
        multi.__dict__["_next_data"],
        torch_worker._worker_loop,
    ) == before
    assert HUB.users == 0 and not HUB.channels


def test_run_and_attach_have_a_switch_to_leave_workers_alone() -> None:
    args = build_parser().parse_args(["run", "--no-dataloader-workers", "prog.py"])
    prof = _profile(args, check_values(args), None, False)
    assert prof.dataloader_workers is False  # type: ignore[union-attr]
    args = build_parser().parse_args(["run", "prog.py"])
    default = _profile(args, check_values(args), None, False)
    assert any(isinstance(c, DataLoaderWorkersCollector) for c in default.collectors)  # type: ignore[union-attr]
    attach = build_parser().parse_args(["attach", "1", "--steps", "1", "--no-dataloader-workers"])
    options = RecordingOptions.from_args(attach)
    assert options.dataloader_workers is False
    assert options.to_wire()["dataloader_workers"] is False
    assert RecordingOptions.from_wire(options.to_wire()).dataloader_workers is False
    assert "dataloader_workers" not in RecordingOptions().to_wire()  # on: the default
