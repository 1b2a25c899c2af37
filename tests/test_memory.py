"""Memory per step (``profile_memory=True``): known allocations come back, the peak table names
the allocating function, a leak is hinted and a steady loop is not, on plain Python, numpy and
torch."""

from __future__ import annotations

import itertools
import mmap
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.memory import memory_summary, steady_rise
from stepscope.cli import main
from stepscope.jsonenc import json_bytes
from stepscope.trace import read_chrome_trace
from stepscope.trace.memory_fields import MEMORY_KEY, StepMemoryRow, step_rows

LEAK = 200_000
BLOCKS, BLOCK = 500, 2_000
STEPS = 7


def make_block() -> list[bytearray]:
    """The transient allocation of each step (about 1 MB), held for a while."""
    return [bytearray(BLOCK) for _ in range(BLOCKS)]


def transient_size() -> int:
    block = make_block()
    return sys.getsizeof(block) + sum(sys.getsizeof(b) for b in block)


def python_loop(
    held: list[Any], leak: bool, steps: int = STEPS, mode: bool | str = "exact"
) -> stepscope.profile:
    """A loop that allocates a known transient block per step, and leaks LEAK bytes if asked.

    Exact mode by default: these tests compare sites byte for byte (test_memory_sampled.py
    covers the sampled sites of the default mode)."""
    with stepscope.profile(profile_memory=mode, torch_ops=False) as prof:  # type: ignore[arg-type]
        for _ in range(steps):
            block = make_block()
            time.sleep(0.03)  # long enough for the watcher to see the step's high
            del block
            if leak:
                held.append(bytearray(LEAK))
            prof.step()
    return prof


def steps_of(prof: stepscope.profile) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = prof.trace().metadata["stepscope_memory"]["steps"]
    return rows[:-1]  # the last row is the step the profile stopped in (nothing ran)


@pytest.mark.parametrize("mode", [True, "exact"])
def test_python_objects_per_step_current_and_peak_within_5_percent(mode: bool | str) -> None:
    held: list[Any] = []
    prof = python_loop(held, leak=True, mode=mode)
    rows = steps_of(prof)
    assert [r["step"] for r in rows] == list(range(STEPS))
    leaked = sys.getsizeof(held[0])
    transient = transient_size()
    for before, row in itertools.pairwise(rows):
        assert row["python_current"] - before["python_current"] == pytest.approx(leaked, rel=0.05)
        rise = row["python_peak"] - before["python_current"]
        assert rise == pytest.approx(transient, rel=0.05)  # the block is freed before the leak
        assert row["rss"] > 0
    summary = memory_summary(prof.trace())
    assert summary is not None
    # the timeline's high in the window is the highest step peak
    timeline = summary.timeline["python heap"]
    assert max(b for _, b in timeline) == pytest.approx(
        max(r["python_peak"] for r in rows), rel=0.05
    )
    assert summary.peak_kind == "python"
    assert summary.peak_bytes == max(r["python_peak"] for r in rows)
    if mode is True:
        return  # sampled sites: test_memory_sampled.py
    by_function: dict[str, int] = {}
    for r in summary.peak_table:
        assert r.file.endswith("test_memory.py") or r.bytes < 1000
        by_function[r.function] = by_function.get(r.function, 0) + r.bytes
    assert by_function["make_block"] == pytest.approx(transient, rel=0.05)
    # the leak held at the peak's snapshot: whole leaked blocks, one per step ended by then (a
    # loaded machine may skip the snapshots of later highs: the time it was taken says which)
    meta = prof.trace().metadata["stepscope_memory"]
    held_then = leaks_between(meta["steps"], 0, meta["peak"]["t_ns"])
    blocks = round(by_function.get("python_loop", 0) / leaked)
    assert blocks == held_then, (blocks, held_then)
    held_bytes = by_function.get("python_loop", 0)  # (and the list holding them)
    assert held_bytes == pytest.approx(blocks * leaked, rel=0.05, abs=4096)


def test_a_leak_is_a_recommendation_in_every_view() -> None:
    # issue 36, point 5: the leak was in the memory section only, not among the recommendations
    # (so not in the Markdown summary written for pull requests and agents)
    from stepscope.analysis.analyze import analyze
    from stepscope.report.markdown import report_markdown

    held: list[Any] = []
    report = analyze([("leaky", python_loop(held, leak=True).trace())])
    [found] = [r for r in report.combined.recommendations if r.rule == "memory_leak"]
    assert found.evidence["kind"] == "python"
    assert found.evidence["per_step_bytes"] == pytest.approx(sys.getsizeof(held[0]), rel=0.05)
    assert "python_loop" in str(found.evidence["site"])
    assert found.title in report_markdown(report).replace("\\", "")
    assert "memory_leak" in report.to_json()
    steady = analyze([("steady", python_loop([], leak=False).trace())])
    assert not [r for r in steady.combined.recommendations if r.rule == "memory_leak"]


def leaks_between(rows: list[dict[str, Any]], since_ns: int, until_ns: int) -> int:
    """The loop's leaks between two step-end snapshots: the steps that ended in between (each
    leaks before its end; the last row, the step the profile stopped in, ran nothing)."""
    return sum(1 for row in rows[:-1] if since_ns < row["end_ns"] <= until_ns)


def test_a_leaking_loop_is_hinted_with_the_site_and_a_steady_one_is_not() -> None:
    held: list[Any] = []
    trace = python_loop(held, leak=True).trace()
    leaking = memory_summary(trace)
    steady = memory_summary(python_loop([], leak=False).trace())
    assert leaking is not None and steady is not None
    [hint] = leaking.leaks
    assert hint.kind == "python"
    leaked = sys.getsizeof(held[0])
    assert hint.per_step_bytes == pytest.approx(leaked, rel=0.05)
    assert hint.sites[0].function == "python_loop"
    # the growth is the leaks between two step-end snapshots; a loaded machine may skip some
    # (the budget is a share of the window's time), so which two is read from the rows
    rows = trace.metadata["stepscope_memory"]["steps"]
    snapshots = [row for row in rows if "site_changes" in row]
    first_snapshot = snapshots[0]["site_changes_since_ns"]  # the window's start
    last = snapshots[-1]["end_ns"]
    possible = {
        leaks_between(rows, since, last)
        for since in [first_snapshot, *(row["end_ns"] for row in snapshots)]
    }
    blocks = round(hint.sites[0].growth_bytes / leaked)
    assert blocks in possible and blocks >= 2, (blocks, possible)
    assert hint.sites[0].growth_bytes == pytest.approx(blocks * leaked, rel=0.05)
    if len(snapshots) == len(rows):  # none skipped: from past the warm-up to the stop
        assert blocks >= 3
    assert steady.leaks == []


def test_too_few_steps_to_judge_a_leak_say_so_instead_of_no_rise() -> None:
    from rich.console import Console

    from stepscope.report.memory import memory_renderables

    held: list[bytearray] = []
    sched = stepscope.schedule(wait=0, warmup=0, active=3, repeat=1)
    with stepscope.profile(profile_memory=True, torch_ops=False, schedule=sched) as prof:
        for _ in range(3):
            held.append(bytearray(LEAK))  # a leak, but only three step ends to see it by
            prof.step()
    summary = memory_summary(prof.trace())
    assert summary is not None and summary.leaks == [] and not summary.leak_judged
    assert any("a leak hint needs 4 step ends" in n for n in summary.notes)
    console = Console(width=200, record=True)
    for part in memory_renderables(summary):
        console.print(part)
    shown = console.export_text()
    assert "No steady rise" not in shown and "a leak hint needs 4 step ends" in shown


def test_a_steady_rise_outside_the_heap_is_noted_as_rss() -> None:
    import mmap

    size = 8 << 20
    held: list[mmap.mmap] = []
    with stepscope.profile(profile_memory=True, torch_ops=False) as prof:
        for _ in range(STEPS):
            block = mmap.mmap(-1, size)  # memory tracemalloc does not see
            block.write(b"x" * size)  # touched, so resident
            held.append(block)
            prof.step()
    summary = memory_summary(prof.trace())
    assert summary is not None and summary.leaks == []  # not the heap's or tensors' doing
    [note] = [n for n in summary.notes if "RSS rose" in n]
    per_step = float(note.split("about ")[1].split(" MiB")[0]) * 1048576
    assert per_step == pytest.approx(size, rel=0.05)
    for block in held:
        block.close()


def test_each_step_names_the_sites_that_allocated_and_freed() -> None:
    held: list[Any] = []
    meta = python_loop(held, leak=True).trace().metadata["stepscope_memory"]
    sites = meta["sites"]
    # step ends past the first three may skip their snapshot on a loaded machine (noted): a
    # snapshot then holds the leaks of every step since the one before it
    rows = [row for row in meta["steps"][1:-1] if "site_changes" in row]
    assert len(rows) >= 2
    for row in rows:
        [(site, size, blocks), *_] = row["site_changes"]  # the biggest change of the step
        assert sites[site]["function"] == "python_loop"
        leaks = leaks_between(meta["steps"], row["site_changes_since_ns"], row["end_ns"])
        assert size == pytest.approx(leaks * sys.getsizeof(held[0]), rel=0.05) and blocks >= 1


def test_steady_rise_needs_a_steady_rise() -> None:
    assert steady_rise([0, 100_000, 200_000, 300_000, 400_000]) == 100_000
    assert steady_rise([i * 10_000 for i in range(8)]) == 10_000
    # a few KiB a step over five steps is lazily built state as often as a leak (an HF Trainer
    # on a GPU rose 18.2, 21.7, 25.8, 29.9, 30.5 KiB): a small rise needs eight step ends
    assert steady_rise([18_600, 22_200, 26_400, 30_600, 31_200]) is None
    assert steady_rise([0, 10_000, 20_000, 30_000, 40_000]) is None
    assert steady_rise([0, 10_000, 20_000]) is None  # too few steps
    assert steady_rise([5_000_000, 5_000_000, 5_000_100, 5_000_000, 5_000_050]) is None
    assert steady_rise([0, 50_000, 50_000, 50_000, 50_000, 50_000]) is None  # warm-up only
    assert steady_rise([0, 10_000, 0, 10_000, 0, 10_000]) is None  # up and down


def test_numpy_arrays_are_counted() -> None:
    np = pytest.importorskip("numpy")
    held: list[Any] = []
    with stepscope.profile(profile_memory="exact", torch_ops=False) as prof:
        for _ in range(5):
            held.append(np.ones(125_000))
            prof.step()
    rows = steps_of(prof)
    for before, row in itertools.pairwise(rows):
        grew = row["python_current"] - before["python_current"]
        assert grew == pytest.approx(held[0].nbytes, rel=0.05)


def test_tracemalloc_already_running_is_left_as_it_was() -> None:
    tracemalloc.start(3)
    try:
        held: list[Any] = []
        big = bytearray(20 << 20)
        del big
        prof = python_loop(held, leak=True, steps=4)
        assert tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 3
        assert tracemalloc.get_traced_memory()[1] >= 20 << 20  # its peak was not reset
        meta = prof.trace().metadata["stepscope_memory"]
        assert meta["tracemalloc"] == "already running: left as it was"
        # between the last two step ends with a snapshot (a loaded machine skips some, and a
        # row without one cannot tell stepscope's own traced bytes apart)
        rows = meta["steps"]
        snapshots = [row for row in rows[:-1] if "site_changes" in row]
        if len(snapshots) >= 2:
            before, after = snapshots[-2:]
            grew = after["python_current"] - before["python_current"]
            leaks = leaks_between(rows, before["end_ns"], after["end_ns"])
            assert grew == pytest.approx(leaks * sys.getsizeof(held[0]), rel=0.05)
        else:  # every snapshot skipped (noted): the totals still hold at least the leaks
            grew = rows[-2]["python_current"] - rows[0]["python_current"]
            assert grew >= 0.95 * (len(rows) - 2) * sys.getsizeof(held[0]), rows
    finally:
        tracemalloc.stop()
    prof = python_loop([], leak=False, steps=2)
    assert not tracemalloc.is_tracing()  # started for the window only
    assert prof.trace().metadata["stepscope_memory"]["tracemalloc"] == "started for the window"


def torch_loop(leak: bool, steps: int = 6) -> tuple[stepscope.profile, list[Any]]:
    torch = pytest.importorskip("torch")
    held: list[Any] = []
    with stepscope.profile(profile_memory=True) as prof:
        for _ in range(steps):
            transient = torch.ones(500_000)  # 2 MB, freed at the end of the step
            if leak:
                held.append(torch.zeros(250_000))  # 1 MB kept
            del transient
            prof.step()
    return prof, held


def test_torch_tensors_per_step_within_5_percent_and_the_leak() -> None:
    prof, held = torch_loop(leak=True)
    kept = held[0].element_size() * held[0].nelement()
    trace = prof.trace()
    summary = memory_summary(trace)
    assert summary is not None
    rows = [s for s in summary.steps if s.step in {r["step"] for r in steps_of(prof)}]
    assert len(rows) >= 4
    for before, row in itertools.pairwise(rows):
        grew = row.tensor_current["cpu"] - before.tensor_current["cpu"]
        assert grew == pytest.approx(kept, rel=0.05)
        rise = row.tensor_peak["cpu"] - before.tensor_current["cpu"]
        assert rise == pytest.approx(kept + 2_000_000, rel=0.05)
    assert [h.kind for h in summary.leaks] == ["cpu"]
    assert summary.leaks[0].per_step_bytes == pytest.approx(kept, rel=0.05)
    # what grew: the tensors kept after the first step, by the operator that made them
    [site] = summary.leaks[0].sites
    assert site.function == "aten::zeros"  # the op the program called, not aten::empty
    assert site.growth_bytes == (len(held) - 1) * kept
    # one counter track per device, as Perfetto shows them
    counters = {c.name for c in trace.iter_counter_events()}
    assert {"Memory cpu", "Python heap", "RSS"} <= counters
    steady, _ = torch_loop(leak=False)
    steady_summary = memory_summary(steady.trace())
    assert steady_summary is not None and steady_summary.leaks == []


def test_torch_peak_table_names_the_allocating_operator() -> None:
    prof, _ = torch_loop(leak=True)
    summary = memory_summary(prof.trace())
    assert summary is not None and summary.peak_kind == "cpu"
    names = {r.function for r in summary.peak_table}
    assert names & {"aten::ones", "aten::empty", "aten::zeros"}
    assert sum(r.bytes for r in summary.peak_table) == summary.peak_bytes


def test_torchs_own_trace_gets_the_tensor_timeline_and_peak(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    held = []
    with torch.profiler.profile(profile_memory=True) as prof:
        for _ in range(5):
            held.append(torch.zeros(250_000))
            prof.step()
    path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(path))
    summary = memory_summary(read_chrome_trace(path))
    assert summary is not None
    points = [b for _, b in summary.timeline["tensors cpu"]]
    assert len(points) == 5
    for before, after in itertools.pairwise(points):
        assert after - before == 1_000_000  # torch's Total Allocated, as torch wrote it
    assert summary.peak_kind == "cpu" and summary.peak_bytes == points[-1]
    assert sum(r.bytes for r in summary.peak_table) == summary.peak_bytes


def test_report_shows_memory_in_terminal_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held: list[Any] = []
    began = time.perf_counter()
    with stepscope.profile(
        profile_memory="exact",
        torch_ops=False,
        on_trace_ready=stepscope.trace_handler(str(tmp_path)),
    ) as prof:
        for _ in range(6):
            block = make_block()
            del block
            held.append(bytearray(LEAK))
            prof.step()
    window_ns = (time.perf_counter() - began) * 1e9  # start to written, however loaded
    [trace] = sorted(tmp_path.glob("*.pt.trace.json"))
    out = tmp_path / "report.json"
    assert main(["report", str(trace), "--json", str(out)]) == 0
    import json

    memory = json.loads(out.read_text())["combined"]["memory"]
    assert memory["leaks"][0]["kind"] == "python"
    assert memory["peak_table"][0]["function"] in (
        "make_block",
        "test_report_shows_memory_in_terminal_and_json",
    )
    assert len(memory["steps"]) == 7
    # every series of the timeline is in the written trace's time base: each point was taken
    # while the profile ran, so within the profile's wall time (measured above) of every span
    # of the trace; another time base would be off by the clocks' offset
    written = read_chrome_trace(trace)
    starts, durs = written.spans["start_ns"], written.spans["dur_ns"]
    first, last = min(starts), max(s + d for s, d in zip(starts, durs, strict=True))
    for name, points in memory["timeline"].items():
        assert all(last - window_ns <= t <= first + window_ns for t, _ in points), name
    assert {"python heap", "rss"} <= set(memory["timeline"])
    capsys.readouterr()
    assert main(["report", str(trace)]) == 0
    shown = capsys.readouterr().out
    assert "Memory per step" in shown and "Alive at the peak" in shown
    assert "Possible leak: Python heap" in shown


def _run_memory(tmp_path: Path, script: str, run: Callable[[list[str]], int]) -> Any:
    prog = tmp_path / "prog.py"
    prog.write_text(script)
    out = tmp_path / "out"
    assert run(["run", "--memory", "--step-on", "none", "-o", str(out), str(prog)]) == 0
    [trace] = sorted(out.glob("*.pt.trace.json"))
    return read_chrome_trace(trace)


def test_run_memory_flag_records_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = "blocks = [bytearray(1000) for _ in range(1000)]\ndel blocks\n"
    trace = _run_memory(tmp_path, script, main)
    err = capsys.readouterr().err
    assert "prog.py: memory: peak 1." in err
    assert "recorded nothing" not in err  # profile_memory needs no torch
    meta = trace.metadata["stepscope_memory"]
    [row] = meta["steps"]
    blocks = 1000 * sys.getsizeof(bytearray(1000))
    assert blocks <= row["python_peak"] <= 1.2 * blocks  # and the program's own code objects


def test_record_shapes_asked_with_memory_is_still_said_to_need_torch(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("blocks = [bytearray(1000) for _ in range(100)]\n")
    out = tmp_path / "out"
    args = ["run", "--memory", "--record-shapes", "--step-on", "none", "-o", str(out), str(prog)]
    # its own process: this one has imported torch already
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "record_shapes recorded nothing" in err and "profile_memory recorded" not in err


def test_a_failing_snapshot_never_breaks_the_program(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.collectors import memory as memory_collector

    def broken() -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
        raise RuntimeError("snapshot failed")

    monkeypatch.setattr(memory_collector, "_snapshot_sites", broken)
    done = 0
    with stepscope.profile(profile_memory="exact", torch_ops=False, strict=False) as prof:
        for _ in range(3):
            make_block()
            done += 1
            prof.step()
    assert done == 3
    assert not tracemalloc.is_tracing()  # closed by the profile even though the window failed
    errors = prof.trace().metadata["stepscope_collector_errors"]
    assert "RuntimeError: snapshot failed" in errors["memory.start"]


def test_a_failing_watcher_is_noted_and_step_ends_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepscope.collectors.memory import MemoryCollector

    def broken(*args: Any) -> bool:
        raise RuntimeError("watcher failed")

    monkeypatch.setattr(MemoryCollector, "_new_high_wanted", broken)
    held: list[Any] = []
    prof = python_loop(held, leak=True, steps=4)
    meta = prof.trace().metadata["stepscope_memory"]
    assert any("watcher failed" in note for note in meta["notes"])
    rows = steps_of(prof)
    grew = rows[-1]["python_current"] - rows[-2]["python_current"]
    assert grew == pytest.approx(sys.getsizeof(held[0]), rel=0.05)


def test_the_watcher_thread_is_never_sampled() -> None:
    import threading

    watchers: set[int | None] = set()
    with stepscope.profile(
        activities=["CPU", "SAMPLING"], profile_memory=True, torch_ops=False, sampling_rate_hz=500
    ) as prof:
        for _ in range(3):
            block = make_block()
            time.sleep(0.05)
            del block
            watchers |= {t.native_id for t in threading.enumerate() if t.name == "stepscope-memory"}
            prof.step()
    tids = {s.tid for s in prof.trace().iter_samples()}
    # threads other tests left running may be sampled (they are the program's, as far as the
    # sampler knows); the watcher and every other thread of stepscope's never are
    own = {t.native_id for t in threading.enumerate() if t.name.startswith("stepscope")}
    assert watchers and not tids & (watchers | own), {
        t.native_id: t.name for t in threading.enumerate()
    }
    assert threading.main_thread().native_id in tids


def test_exact_mode_snapshots_of_a_big_heap_stay_within_the_budget() -> None:
    kept: list[Any] = []
    with stepscope.profile(profile_memory="exact", torch_ops=False) as prof:
        for _ in range(6):
            kept.append([(i,) for i in range(150_000)])
            prof.step()
    notes = prof.trace().metadata["stepscope_memory"]["notes"]
    [note] = [n for n in notes if "step-end snapshots of the Python heap were skipped" in n]
    # before, the first three step ends and the last were copied whatever they cost (12x
    # tracemalloc alone on a 6 M-block heap): at most the 4th and 5th could be skipped
    assert int(note.split()[0]) >= 4


def vm_rss() -> int:
    """The resident set size from /proc/self/status (another file than stepscope reads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
@pytest.mark.parametrize("mode", [True, "exact"])
def test_each_step_row_holds_the_resident_size_at_its_end_and_the_timeline_shares_it(
    mode: bool | str,
) -> None:
    grow = 16 << 20
    held: list[mmap.mmap] = []
    own: list[int] = []
    page = b"x" * mmap.PAGESIZE
    with stepscope.profile(profile_memory=mode, torch_ops=False) as prof:  # type: ignore[arg-type]
        for _ in range(5):
            held.append(mmap.mmap(-1, grow))  # fresh pages, not the heap's reused ones
            for _ in range(grow // mmap.PAGESIZE):
                held[-1].write(page)
            own.append(vm_rss())
            prof.step()
    rows = steps_of(prof)
    assert len(rows) == 5
    for row, seen in zip(rows, own, strict=True):
        # within 3 MiB: between the two readings stepscope's own step work may fault in a
        # 2 MiB huge page (seen once in four runs); a reading of another step is 16 MiB off
        assert abs(row["rss"] - seen) < (3 << 20), [
            r["rss"] - o for r, o in zip(rows, own, strict=True)
        ]
    assert own[-1] - own[0] >= 4 * grow  # the size moved: the rows followed it
    summary = memory_summary(prof.trace())
    assert summary is not None
    # the RSS track has a point at each step boundary, with the row's reading
    timeline = summary.timeline["rss"]
    for row in rows:
        assert any(0 <= t - row["end_ns"] < 50_000_000 and b == row["rss"] for t, b in timeline)


@pytest.mark.parametrize("mode", [True, "exact"], ids=["hook", "tracemalloc"])
def test_step_rows_are_typed_and_read_back_as_written(tmp_path: Path, mode: bool | str) -> None:
    prof = python_loop([], leak=False, steps=3, mode=mode)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    written = read_chrome_trace(tmp_path / "t.json").metadata[MEMORY_KEY]
    rows = step_rows(written)
    assert rows == step_rows(prof.trace().metadata[MEMORY_KEY])  # the live trace's, typed
    assert len(rows) == 4 and all(isinstance(r.python_current, int) for r in rows)
    assert [json_bytes(r.to_json()) for r in rows] == [json_bytes(r) for r in written["steps"]]
    hook = "heap" in written  # the default mode, or tracemalloc without the extension
    assert (rows[1].python_allocated is not None) == hook  # the hook's counts only
    # a step whose heap was not read (the program stopped tracemalloc) has its times only
    assert StepMemoryRow(5, 10, 20).to_json() == {"step": 5, "start_ns": 10, "end_ns": 20}
    odd = {"step": 5, "python_current": "12", "cuda_allocator": {"ooms": 1, "x": None}}
    assert StepMemoryRow.from_json(odd) == StepMemoryRow(5, 0, 0, cuda_allocator={"ooms": 1})
    assert StepMemoryRow.from_json({"step": "5"}) is None


def test_a_file_is_analysed_with_its_steps_found_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis import steps
    from stepscope.analysis.analyze import analyze_file

    trace = python_loop([], leak=False, steps=3).trace()
    found = steps._step_spans
    calls: list[int] = []

    def counted(*args: Any) -> Any:
        calls.append(1)
        return found(*args)

    monkeypatch.setattr(steps, "_step_spans", counted)
    part = analyze_file("t", trace)
    assert len(calls) == 1  # the breakdowns, the memory section and the ranks share them
    assert part.summary.memory is not None and part.ranks is not None
    assert [s.step for s in part.summary.steps] == [0, 1, 2]
    assert [s.step for s in part.summary.memory.steps] == [0, 1, 2, 3]  # 3: the step cut short
