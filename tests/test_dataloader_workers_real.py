"""DataLoader workers on real torch DataLoaders with worker processes (fork and spawn).

Each item carries its dataset's own measurements (``tests.dataloader_programs``): the worker
that made it, its ``__getitem__``'s CPU time by ``time.thread_time_ns()`` and its wall span.
stepscope's per-step batch, worker, attributed dataset CPU and each worker's busy share are
checked against them.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import stepscope
from stepscope.analysis.analyze import analyze, analyze_trace
from stepscope.analysis.data_workers_types import LoaderReport
from stepscope.analysis.steps import find_steps
from stepscope.cli import main
from stepscope.collectors import dataloader_ring
from stepscope.collectors.dataloader_hooks import HUB
from stepscope.failures import failure_counts
from stepscope.report.html import write_html
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.model import Trace
from stepscope.trace.worker_tracks import METADATA_KEY, WORKER_CATEGORY
from tests import test_report_html
from tests.dataloader_programs import PROGRAM, Logged, TimedDataset, TimedStream, run_loop
from tests.test_dataloader_workers import ASKED, BATCHES, made_by_hand

pytestmark = pytest.mark.slow
ROOT = str(Path(__file__).resolve().parents[1])
MS = 1_000_000
WORKER_DIED = (
    r"DataLoader worker \(pids?\(?s?\)? [0-9, ]+\) (exited unexpectedly|is killed by signal)"
)
"""torch's own error for a dead worker: from the loop's wait, or from its SIGCHLD handler."""


def _loader_report(trace: Trace) -> LoaderReport:
    section = analyze_trace(trace).data_workers
    assert section is not None and len(section.loaders) == 1
    return section.loaders[0]


def _check_steps(report: LoaderReport, logged: Logged, first_step: int = 0) -> None:
    """Each step's batch and worker are what the loop logged; ≥ 95 % of the dataset's own CPU
    time is attributed to the steps that took the batches."""
    assert [r.step for r in report.steps] == list(range(first_step, first_step + len(report.steps)))
    truth = attributed = 0
    for row in report.steps:
        items = logged.steps[row.step]  # type: ignore[index]
        assert row.batch == row.step
        assert [item[0] for item in items] == [
            row.batch * len(items) + k for k in range(len(items))
        ]
        assert row.worker == logged.worker(row.step)  # type: ignore[arg-type]
        assert row.dataset_cpu_ns is not None, row
        truth += logged.cpu_ns(row.step)  # type: ignore[arg-type]
        attributed += min(row.dataset_cpu_ns, logged.cpu_ns(row.step))  # type: ignore[arg-type]
        # stepscope's dataset part also holds the fetch loop and the items' tensors
        assert row.dataset_cpu_ns <= 1.5 * logged.cpu_ns(row.step) + 2_000_000, row  # type: ignore[arg-type]
    assert attributed >= 0.95 * truth, (attributed, truth)


def _busy_pct(logged: Logged, worker: int, lo: int, hi: int) -> float:
    """A worker's share of its active time in [lo, hi) (from its first item on) inside its
    items' ``__getitem__``, by the dataset's own clock."""
    items = [item for step in logged.steps for item in step if item[1] == worker]
    busy = sum(max(0, min(item[4], hi) - max(item[3], lo)) for item in items)
    return 100.0 * busy / (hi - max(lo, min(item[3] for item in items)))


@pytest.mark.parametrize(
    ("workers", "method"),
    [(2, "fork"), (4, "fork"), (2, "spawn")],
    ids=["2-fork", "4-fork", "2-spawn"],
)
def test_each_step_gets_its_batch_worker_and_dataset_time(workers: int, method: str) -> None:
    loader = DataLoader(
        TimedDataset(8 * workers, 30_000),
        batch_size=2,
        num_workers=workers,
        multiprocessing_context=method,
    )
    with stepscope.profile(activities=["CPU"], torch_ops=False) as prof:
        logged = run_loop(loader, prof)
    trace = prof.trace()
    report = _loader_report(trace)
    assert report.settings["num_workers"] == workers
    assert report.settings["start_method"] == method
    assert len(report.steps) == len(logged.steps)
    _check_steps(report, logged)
    # each worker has its own track, named, next to the main thread, with its samples
    names = trace.thread_names()
    worker_pids = {w.worker: w_pid for w in report.workers for w_pid in w.pids}
    assert len(worker_pids) == workers
    for share in report.workers:
        (pid,) = share.pids
        assert names[(os.getpid(), pid)] == f"DataLoader 1 worker {share.worker} (pid {pid})"
    sampled = {t for t in trace.samples["tid"].tolist()}
    assert sampled & {p for w in report.workers for p in w.pids}
    assert all(f.name.startswith(("spin", "_item", "TimedDataset")) for f in report.functions[:1])
    # worker spans are not the program's own host time
    keys = {row.key for row in prof.key_averages()}
    assert not {k for k in keys if k.startswith("batch ")} | (keys & {"dataset", "collate"})


def test_the_advice_names_two_busy_workers_and_their_shares() -> None:
    # items that wait 10 ms each (as on a slow disk): the loop, which does nothing else,
    # waits for them however loaded the machine's CPUs are
    loader = DataLoader(TimedDataset(48, 20_000, sleep_s=0.01), batch_size=2, num_workers=2)
    with stepscope.profile(activities=["CPU"], torch_ops=False) as prof:
        logged = run_loop(loader, prof)
    summary = analyze_trace(prof.trace())
    assert summary.data_workers is not None
    report = summary.data_workers.loaders[0]
    _check_steps(report, logged)
    (advice,) = [r for r in summary.recommendations if r.rule == "data_loading"]
    text = advice.title + " " + advice.advice
    shares = {w.worker: w for w in report.workers}
    assert set(shares) == {0, 1}
    for w in report.workers:
        (pid,) = w.pids
        assert f"{w.worker} (pid {pid})" in text
        assert f"{w.busy_pct:.1f} %" in text
    assert advice.evidence["workers_busy_pct"] == {
        str(w.worker): round(w.busy_pct, 1) for w in report.workers
    }
    # each batch span holds its items' own __getitem__ spans (the dataset's clock, 1 ms of
    # skew allowed): stepscope's batch is the whole fetch, the items plus what lies between
    # them, collate and the send
    trace = prof.trace()
    items = {step[0][0] // 2: step for step in logged.steps}
    for span in trace.iter_spans():
        if span.cat == WORKER_CATEGORY and span.name.startswith("batch "):
            made = items[int(span.name.split()[1])]
            assert span.start_ns - MS <= min(item[3] for item in made), span
            assert max(item[4] for item in made) <= span.start_ns + span.dur_ns + MS, span
    # so each worker's busy share holds the dataset's own share, and not much more (the gaps
    # and collate, longer on a loaded machine: preemption lands there too)
    complete, _ = find_steps(trace)
    lo, hi = complete[0].start_ns, max(s.end_ns for s in complete)
    for w in report.workers:
        own = _busy_pct(logged, w.worker, lo, hi)
        assert own - 1.0 <= w.busy_pct <= own + 15.0, (w, own)
    # the workers keep up with a loop that does nothing only when both are busy: then more
    # workers, else (one lagging, the other idle with its prefetched tasks done) not
    busy = all(w.busy_pct >= 80 for w in report.workers)
    assert ("raise num_workers from 2 to 4" in advice.advice) == busy, advice.advice
    assert ("more workers will not help" in advice.advice) == (not busy), advice.advice


def test_persistent_workers_an_iterable_dataset_and_the_users_worker_init_fn() -> None:
    from tests.dataloader_programs import mark_worker

    loader = DataLoader(
        TimedStream(12, 20_000),
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=mark_worker,
    )
    with stepscope.profile(activities=["CPU"], torch_ops=False) as prof:
        logged = run_loop(loader, prof, epochs=2)
    # the user's worker_init_fn ran in every worker (chained, not replaced)
    assert {item[5] for step in logged.steps for item in step} == {100, 101}
    report = _loader_report(prof.trace())
    assert report.settings["persistent_workers"] and report.settings["iterable_dataset"]
    assert [r.epoch for r in report.steps] == [0] * 6 + [1] * 6
    for row in report.steps:
        items = logged.steps[row.step]  # type: ignore[index]
        assert row.worker == logged.worker(row.step)  # type: ignore[arg-type]
        assert row.batch == (row.step or 0) % 6  # task numbers start again each epoch
        assert row.dataset_cpu_ns is not None
        assert row.dataset_cpu_ns >= 0.95 * sum(item[2] for item in items)
    assert [len(w.pids) for w in report.workers] == [1, 1]  # the same processes both epochs


def test_a_window_ending_while_workers_are_mid_batch() -> None:
    loader = DataLoader(TimedDataset(40, 150_000), batch_size=1, num_workers=2)
    traces: list[Trace] = []
    schedule = stepscope.schedule(wait=1, warmup=1, active=2, repeat=3)
    with stepscope.profile(
        activities=["CPU"],
        torch_ops=False,
        schedule=schedule,
        on_trace_ready=lambda p: traces.append(p.trace()),
    ) as prof:
        logged = run_loop(loader, prof)
    assert len(traces) == 3
    cut = 0
    for trace in traces:
        window = trace.metadata["stepscope_window"]
        for span in trace.iter_spans():
            is_batch = span.cat == WORKER_CATEGORY and span.name.startswith("batch ")
            if is_batch and (span.args or {}).get("stepscope.open_at_window_end"):
                cut += 1
                assert span.start_ns + span.dur_ns == window["end_ns"]
        report = _loader_report(trace)
        for row in report.steps:
            assert row.worker == logged.worker(row.step)  # type: ignore[arg-type]
            assert row.batch == row.step
    assert cut >= 1  # a slow dataset and a quick loop: workers were mid-batch at some end


def test_a_killed_worker_leaves_the_loops_error_and_a_readable_trace(tmp_path: Path) -> None:
    loader = DataLoader(TimedDataset(64, 20_000, kill_at=21), batch_size=2, num_workers=2)
    started = time.monotonic()
    profiled = stepscope.profile(
        activities=["CPU"], torch_ops=False, on_trace_ready=stepscope.trace_handler(str(tmp_path))
    )
    # torch's own error: from its SIGCHLD handler, its wait, or the batch's transfer cut short
    with pytest.raises((RuntimeError, ConnectionError, EOFError)) as raised, profiled:
        run_loop(loader, profiled)
    assert not isinstance(raised.value, RuntimeError) or re.search(WORKER_DIED, str(raised.value))
    assert time.monotonic() - started < 60
    (path,) = tmp_path.glob("*.json")
    trace = read_chrome_trace(path)
    (entry,) = trace.metadata[METADATA_KEY]
    dead = [w for w in entry["workers"] if w.get("exited")]
    assert dead
    died_in = [
        s
        for s in trace.iter_spans()
        if s.cat == WORKER_CATEGORY
        and s.name == "batch 10"
        and (s.args or {}).get("stepscope.open_at_window_end")
    ]
    assert len(died_in) == 1  # the batch the worker was making when it was killed
    report = _loader_report(trace)
    assert report.steps and all(r.batch == r.step for r in report.steps)
    del loader, raised
    gc.collect()  # the iterator lived on in the error's frames
    assert not HUB.channels  # its channel went with it


def test_stepscope_run_records_workers_and_keeps_the_programs_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "train.py"
    program.write_text(PROGRAM.format(root=ROOT, kill_at=150))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT + "/src", ROOT])}
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "-o", str(out), "--active", "4", str(program)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert re.search(WORKER_DIED, done.stderr), done.stderr[-2000:]
    assert "done" not in done.stdout
    (path,) = out.glob("*.json")
    trace = read_chrome_trace(path)
    report = _loader_report(trace)
    assert report.settings["num_workers"] == 2
    assert {r.worker for r in report.steps} == {0, 1}
    assert [r.batch for r in report.steps] == sorted(r.batch for r in report.steps)
    assert main(["report", str(path)]) == 0
    shown = capsys.readouterr()
    assert "DataLoader 1 (TimedDataset; num_workers=2" in shown.out


def test_no_dataloader_workers_records_nothing() -> None:
    loader = DataLoader(TimedDataset(8, 1_000), batch_size=2, num_workers=2)
    with stepscope.profile(activities=["CPU"], torch_ops=False, dataloader_workers=False) as prof:
        run_loop(loader, prof)
    trace = prof.trace()
    assert METADATA_KEY not in trace.metadata
    assert WORKER_CATEGORY not in trace.strings
    assert (
        torch.utils.data._utils.worker._worker_loop.__module__ == "torch.utils.data._utils.worker"
    )


browser = test_report_html.browser
"""Headless Chromium (the HTML report tests' fixture)."""


def test_the_html_page_shows_each_step_and_worker(tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "report.html"
    write_html(analyze([("t", made_by_hand(BATCHES, ASKED))], flames=True), page)
    test_report_html.assert_clean(browser, test_report_html.load(browser, page))
    section = browser.find_element(By.ID, "data-workers")
    assert "DataLoader 1 (Images; num_workers=2, prefetch_factor=2" in section.text
    rows = browser.find_elements(By.CSS_SELECTOR, "#table-worker-steps-0 tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[3].text for r in rows] == [
        "just in time",
        "ahead",
        "ahead",
        "late",
    ]
    shares = browser.find_elements(By.CSS_SELECTOR, "#table-workers-0 tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[3].text for r in shares] == ["47.5 %", "82.5 %"]


def test_a_channel_that_cannot_be_made_leaves_the_loader_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the channel's file cannot be sized (as on a full /dev/shm): os.ftruncate raises
    monkeypatch.setattr(dataloader_ring, "_size", lambda workers, slots: -1)
    before = failure_counts().get("collectors", {}).get("dataloader_hook", 0)
    loader = DataLoader(TimedDataset(8, 1_000), batch_size=2, num_workers=2)
    with stepscope.profile(activities=["CPU"], torch_ops=False) as prof:
        logged = run_loop(loader, prof)
    assert [step[0][0] for step in logged.steps] == [0, 2, 4, 6]  # every batch, in order
    assert failure_counts()["collectors"]["dataloader_hook"] == before + 1
    assert METADATA_KEY not in prof.trace().metadata


def test_a_later_profile_follows_an_iterator_an_earlier_one_saw_start() -> None:
    loader = DataLoader(TimedDataset(40, 10_000), batch_size=2, num_workers=2)
    with stepscope.profile(activities=["CPU"], torch_ops=False) as first:
        batches = iter(loader)  # its workers start hooked
        for _ in range(3):
            next(batches)
            first.step()
    # between the profiles: torch's own iterator, unhooked, its workers still ours
    assert type(torch.utils.data._utils.worker._worker_loop).__name__ == "function"
    for _ in range(3):
        next(batches)
    with stepscope.profile(activities=["CPU"], torch_ops=False) as second:
        logged = Logged()
        for _ in range(8):
            logged.steps.append(next(batches).tolist())
            second.step()
    report = _loader_report(second.trace())
    assert [r.batch for r in report.steps] == list(range(6, 14))
    assert [r.worker for r in report.steps] == [logged.worker(k) for k in range(8)]
    # batches 6-9 may have been made (2 workers x prefetch_factor 2) before it recorded; the
    # tasks of 10-13 were sent while it did
    assert not [r for r in report.steps[4:] if r.status == "unknown"]
    del batches
    gc.collect()
    assert not HUB.channels
