"""The pipeline: export thread, flush/shutdown, ring bounds, retries, spill, channels, telemetry."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from stepscope.metrics import (
    Pipeline,
    PipelineMetricHandler,
    RetryPolicy,
    api,
    configure,
    prof,
    put_metric,
)
from stepscope.metrics.api import NullMetricHandler
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.points import ExportBatch, SummaryValue
from stepscope.metrics.spill import read_spill
from stepscope.steps import set_step
from tests.metrics_fixtures import CollectingExporter, ListSink

pytestmark = pytest.mark.implementation_independent


class FlakyExporter(Exporter):
    """Fails its first ``failures`` calls, then delivers into a list."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.batches: list[ExportBatch] = []

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("backend unavailable")
        self.batches.append(batch)


@pytest.fixture
def pipelines(tmp_path: Path) -> Iterator[list[Pipeline]]:
    made: list[Pipeline] = []
    yield made
    for p in made:
        p.shutdown(timeout_s=5)


def make(pipelines: list[Pipeline], tmp_path: Path, **settings: Any) -> Pipeline:
    settings.setdefault("interval_s", 60)
    settings.setdefault("handle_sigterm", False)
    settings.setdefault("spill_dir", tmp_path / "spill")
    p = Pipeline(**settings)
    pipelines.append(p)
    return p


def test_periodic_export_runs_on_the_export_thread(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    seen_threads: list[str] = []
    done = threading.Event()

    class ThreadRecorder(CollectingExporter):
        def export(self, batch: ExportBatch, timeout_s: float) -> None:
            seen_threads.append(threading.current_thread().name)
            super().export(batch, timeout_s)
            if len(self.batches) >= 2:
                done.set()

    p = make(pipelines, tmp_path, interval_s=0.05)
    exporter = ThreadRecorder()
    p.add_exporter(exporter)
    p.counter("ticks").inc()
    assert done.wait(10)
    assert set(seen_threads) == {"stepscope-metrics-export"}
    assert exporter.values("ticks")[()] == 1


def test_shutdown_exports_everything_and_closes(pipelines: list[Pipeline], tmp_path: Path) -> None:
    p = make(pipelines, tmp_path)
    exporter = CollectingExporter()
    p.add_exporter(exporter)
    s = p.scalar("loss")
    set_step(0)
    s.record(1.0)
    set_step(1)
    s.record(2.0)  # the current step: still open until shutdown
    p.shutdown()
    assert exporter.closed
    assert exporter.batches[-1].final
    assert [(pt.step, pt.value) for pt in exporter.scalars()] == [(0, 1.0), (1, 2.0)]
    acc = p.accounting()["collect"]
    assert (acc["produced"], acc["exported"], acc["spilled"], acc["dropped"]) == (2, 2, 0, 0)
    p.shutdown()  # idempotent
    assert p.flush(1)
    with pytest.raises(RuntimeError, match="shut down"):
        p.add_exporter(CollectingExporter())


def test_full_ring_drops_and_counts(
    pipelines: list[Pipeline], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = make(pipelines, tmp_path, ring_capacity=100)
    exporter = CollectingExporter()
    p.add_exporter(exporter)
    s = p.scalar("burst", "sum")
    set_step(0)
    with p._cycle_lock:  # hold the export thread off while the burst arrives
        for _ in range(500):
            s.record(1.0)
    with caplog.at_level(logging.WARNING, logger="stepscope.metrics"):
        p.shutdown()
    acc = p.accounting()["collect"]
    assert acc["produced"] == 500
    assert acc["dropped_by_reason"]["ring_full"] == 500 - acc["exported"]
    assert acc["exported"] + acc["spilled"] + acc["dropped"] == acc["produced"]
    # the ring holds 100 items: the step's record time (queued with its first value) and 99 values
    assert 99 <= acc["exported"] < 500
    assert sum(pt.value for pt in exporter.scalars()) == acc["exported"]
    closing = [r.getMessage() for r in caplog.records if "of 500 records" in r.getMessage()]
    assert len(closing) == 1 and "ring_full=" in closing[0]


def test_failed_exports_are_retried_then_spilled_then_recover(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    # the loop's first step is declared before the pipeline exists: declaring it asks every
    # live pipeline to export at once, on its thread, which would race the cycles run here
    set_step(0)
    p = make(
        pipelines,
        tmp_path,
        retry=RetryPolicy(attempts=2, initial_backoff_s=0.001, max_backoff_s=0.001),
    )
    flaky = FlakyExporter(failures=4)
    p.add_exporter(flaky)
    s = p.scalar("v", "last")
    for step in range(3):
        set_step(step)
        s.record(float(step))
        p._cycle(close_all=True, final=False)  # one export per step
        if step < 2:
            # down: two attempts each, then the batch goes to the spill file
            p._deliveries[0].down_until_ns = 0  # skip the wait between cycles
    acc = p.accounting()["flaky"]
    assert flaky.calls == 5  # 2 + 2 failed attempts, then success
    assert acc["export_failures"] == 4
    assert (acc["produced"], acc["exported"], acc["spilled"], acc["dropped"]) == (3, 1, 2, 0)
    entries = read_spill(acc["spill_file"])
    assert [(e["kind"], e["step"], e["value"], e["exporter"]) for e in entries] == [
        ("scalar", 0, 0.0, "flaky"),
        ("scalar", 1, 1.0, "flaky"),
    ]
    assert [pt.step for b in flaky.batches for pt in b.scalars] == [2]


def test_backend_down_goes_straight_to_spill_during_backoff(
    pipelines: list[Pipeline], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = make(pipelines, tmp_path, retry=RetryPolicy(attempts=1, initial_backoff_s=0.0))
    flaky = FlakyExporter(failures=10**6)
    p.add_exporter(flaky)
    s = p.scalar("v")
    for step in range(5):
        set_step(step)
        s.record(1.0)
        p._cycle(close_all=True, final=False)
    assert flaky.calls == 1  # the others fell inside the backoff window
    acc = p.accounting()["flaky"]
    assert acc["spilled"] == 5 and acc["exported"] == 0
    assert acc["last_error"] == "ConnectionError: backend unavailable"
    with caplog.at_level(logging.WARNING, logger="stepscope.metrics"):
        p.shutdown(timeout_s=5)
    closing = [r.getMessage() for r in caplog.records if "of 5 records" in r.getMessage()]
    assert len(closing) == 1, closing
    assert "last error: ConnectionError: backend unavailable" in closing[0]


def test_spill_budget_counts_what_does_not_fit(pipelines: list[Pipeline], tmp_path: Path) -> None:
    p = make(
        pipelines, tmp_path, spill_max_bytes=200, retry=RetryPolicy(attempts=1, initial_backoff_s=0)
    )
    p.add_exporter(FlakyExporter(failures=10**6))
    s = p.scalar("v")
    for step in range(6):
        set_step(step)
        s.record(1.0)
        p._cycle(close_all=True, final=False)
    acc = p.accounting()["flaky"]
    assert acc["spilled"] >= 1
    assert acc["dropped_by_reason"]["spill_full"] == 6 - acc["spilled"]
    assert acc["spilled"] + acc["dropped"] == 6
    assert Path(acc["spill_file"]).stat().st_size <= 200


def test_a_failing_exporter_does_not_starve_the_others(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    p = make(pipelines, tmp_path, retry=RetryPolicy(attempts=1, initial_backoff_s=0))
    p.add_exporter(FlakyExporter(failures=10**6))
    good = CollectingExporter()
    p.add_exporter(good)
    p.counter("c").inc(3)
    assert p.flush(10)
    assert good.values("c")[()] == 3
    assert p.telemetry()["exporters"]["flaky"]["export_failures"] == 1


def test_exporter_names_are_unique_and_removal_closes(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    p = make(pipelines, tmp_path)
    a, b = CollectingExporter(), CollectingExporter()
    p.add_exporter(a)
    p.add_exporter(b)
    p.add_exporter(a)  # already there
    assert list(p.accounting()) == ["collect", "collect-2"]
    p.remove_exporter(a)
    assert a.closed and p.exporters() == [b]
    with pytest.raises(TypeError, match="HandlerExporter"):
        p.add_exporter(NullMetricHandler())  # type: ignore[type-var]


def test_configure_validates(pipelines: list[Pipeline], tmp_path: Path) -> None:
    p = make(pipelines, tmp_path)
    with pytest.raises(ValueError, match="interval_s"):
        p.configure(interval_s=0)
    with pytest.raises(ValueError, match="ring capacity"):
        p.configure(ring_capacity=0)
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(TypeError, match="RetryPolicy"):
        p.configure(retry=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="spill_max_bytes"):
        p.configure(spill_max_bytes=-1)


def test_pipeline_handler_routes_seed_api_without_caller_io(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    p = make(pipelines, tmp_path)
    exporter = CollectingExporter()
    p.add_exporter(exporter)
    configure(PipelineMetricHandler(p), group="trainer")

    @prof(group="trainer")
    def step_fn() -> int:
        return 1

    for _ in range(3):
        step_fn()
    put_metric("restarts", 2, "trainer")
    assert p.flush(10)
    records = exporter.records()
    key = f"{api._get_metric_name(step_fn)}"
    assert [r.name for r in records].count(f"{key}.success") == 3
    durations = [r.value for r in records if r.name == f"{key}.duration.ms"]
    assert len(durations) == 3 and all(0 < d < 1000 for d in durations)
    assert any(d != int(d) for d in durations)  # sub-millisecond resolution kept
    summary = exporter.values(f"{key}.success")[(("group", "trainer"),)]
    assert summary == SummaryValue(3.0, 3)
    assert exporter.values("restarts")[(("group", "trainer"),)] == SummaryValue(2.0, 1)
    acc = p.accounting()["collect"]
    assert acc["produced"] == acc["exported"] == 7


class SlowSink(ListSink):
    def write_records(self, records: Sequence[Any], timeout_s: float) -> None:
        self.thread = threading.current_thread().name
        super().write_records(records, timeout_s)


def test_channels_hand_batches_to_their_sink_on_the_export_thread(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    p = make(pipelines, tmp_path)
    sink = SlowSink()
    channel = p.open_channel("events", sink)
    assert p.open_channel("events", sink) is channel
    with pytest.raises(ValueError, match="another sink"):
        p.open_channel("events", ListSink())
    for i in range(10):
        assert channel.put({"i": i})
    assert p.flush(10)
    assert sink.records == [{"i": i} for i in range(10)]
    assert sink.thread == "stepscope-metrics-export"
    assert sink.batches == 1
    assert p.telemetry()["channels"]["events"]["exported"] == 10


def test_channel_sink_failures_spill_and_full_ring_refuses(
    pipelines: list[Pipeline], tmp_path: Path
) -> None:
    class DownSink(ListSink):
        def write_records(self, records: Sequence[Any], timeout_s: float) -> None:
            raise OSError("disk full")

    p = make(pipelines, tmp_path, ring_capacity=4, retry=RetryPolicy(attempts=1))
    channel = p.open_channel("audit", DownSink())
    with p._cycle_lock:
        results = [channel.put({"n": n}) for n in range(6)]
    assert results == [True] * 4 + [False] * 2
    assert p.flush(10)
    stats = p.telemetry()["channels"]["audit"]
    assert stats["spilled"] == 4
    assert stats["dropped_by_reason"] == {"ring_full": 2}
    spill = next((tmp_path / "spill").glob("channel-audit-*.jsonl"))
    assert [json.loads(line)["data"] for line in spill.read_text().splitlines()] == [
        {"n": n} for n in range(4)
    ]


def test_close_channel_delivers_then_refuses(pipelines: list[Pipeline], tmp_path: Path) -> None:
    p = make(pipelines, tmp_path)
    sink = ListSink()
    closed: list[bool] = []
    sink.close = lambda: closed.append(True)  # type: ignore[method-assign]
    channel = p.open_channel("audit", sink)
    for n in range(3):
        channel.put(n)
    assert p.close_channel("audit")
    assert sink.records == [0, 1, 2] and closed == [True]
    assert not channel.put(3)
    assert p.ring.dropped(channel.drop_key) == 1
    assert "audit" not in p.telemetry()["channels"]
    assert p.close_channel("audit")  # closing twice is harmless
    assert p.open_channel("audit", ListSink()) is not channel
