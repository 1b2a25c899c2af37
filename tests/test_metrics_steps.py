"""Metrics and the one step counter: every exporter gets the step a value belongs to and the time
it was recorded (not the time it was exported), and the step gauge is there once a loop starts.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.metrics import (
    ConsoleExporter,
    CsvExporter,
    JsonlExporter,
    Pipeline,
    PipelineMetricHandler,
    StatsdExporter,
    configure,
    put_metric,
)
from stepscope.steps import current_step, set_step
from tests.metrics_fixtures.servers import PrometheusStack, prometheus_stack  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

SLACK_NS = 2_000_000  # stepscope's clock vs time.time_ns(): one wall base, read at import
EXPORT_DELAY_S = 0.3  # the export happens this long after the record, so the two cannot mix up


def record_timed(p: Pipeline, name: str, step: int, value: float) -> tuple[int, int]:
    """Record ``value`` during ``step`` (the shared counter); the wall times around the call."""
    set_step(step)
    scalar = p.scalar(name)
    before = time.time_ns()
    scalar.record(value)
    after = time.time_ns()
    return before, after


def assert_recorded_within(ns: int, window: tuple[int, int]) -> None:
    before, after = window
    assert before - SLACK_NS <= ns <= after + SLACK_NS, (ns - before, after - ns)


@pytest.mark.implementation_independent
def test_file_and_console_rows_carry_step_and_record_time(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    jsonl, table = tmp_path / "m.jsonl", tmp_path / "m.csv"
    console = io.StringIO()
    pipeline.add_exporter(JsonlExporter(jsonl))
    pipeline.add_exporter(CsvExporter(table))
    pipeline.add_exporter(ConsoleExporter(console))
    configure(PipelineMetricHandler(pipeline), "seed")
    set_step(6)  # the loop is running (its first step already exported the step gauge)
    pipeline.flush(10)
    try:
        window = record_timed(pipeline, "train.loss", 7, 0.5)
        put_before = time.time_ns()
        put_metric("tokens", 128, "seed")
        pipeline.counter("requests").inc()
        time.sleep(EXPORT_DELAY_S)
        set_step(8)
        exported_after = time.time_ns()
        pipeline.flush(10)
    finally:
        configure(stepscope.metrics.NullMetricHandler(), "seed")

    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    (loss,) = [r for r in rows if r["name"] == "train.loss"]
    assert (loss["kind"], loss["step"], loss["value"]) == ("scalar", 7, 0.5)
    assert_recorded_within(loss["time_unix_ns"], window)
    (tokens,) = [r for r in rows if r["name"] == "tokens" and r["kind"] == "record"]
    assert tokens["step"] == 7 and tokens["time_unix_ns"] >= put_before - SLACK_NS
    assert tokens["time_unix_ns"] < exported_after - SLACK_NS
    (requests,) = [r for r in rows if r["name"] == "requests"]
    assert requests["step"] == 8  # a cumulative series: the step when the snapshot was taken
    assert requests["time_unix_ns"] >= exported_after - SLACK_NS
    gauges = [(r["step"], r["value"]) for r in rows if r["name"] == "stepscope.step"]
    assert gauges == [(6, 6.0), (8, 8.0)]  # a row whenever the step gauge changed

    with table.open(newline="") as fh:
        (csv_loss,) = [r for r in csv.DictReader(fh) if r["name"] == "train.loss"]
    assert csv_loss["step"] == "7"
    assert int(csv_loss["time_unix_ns"]) == loss["time_unix_ns"]

    (line,) = [ln for ln in console.getvalue().splitlines() if "train.loss" in ln]
    assert line == f"[{loss['time_unix_ns'] / 1e9}][step 7]: train.loss=0.5"


@pytest.mark.implementation_independent
def test_a_step_reduced_from_several_values_is_stamped_with_its_first(pipeline: Pipeline) -> None:
    out: list[Any] = []

    class Collect(stepscope.metrics.Exporter):
        name = "collect"

        def export(self, batch: Any, timeout_s: float) -> None:
            out.extend(batch.scalars)

    pipeline.add_exporter(Collect())
    first = record_timed(pipeline, "loss", 3, 1.0)
    time.sleep(0.05)
    pipeline.scalar("loss").record(3.0)
    time.sleep(EXPORT_DELAY_S)
    pipeline.flush(10)  # closes step 3 (flush closes the current step)
    late = record_timed(pipeline, "loss", 3, 9.0)  # a late value of a closed step: a new point
    time.sleep(EXPORT_DELAY_S)
    pipeline.flush(10)
    assert [(p.step, p.value, p.count) for p in out] == [(3, 2.0, 2), (3, 9.0, 1)]
    assert_recorded_within(out[0].time_unix_ns, first)
    assert_recorded_within(out[1].time_unix_ns, late)


def test_step_gauge_is_served_as_soon_as_the_profiler_starts(pipeline: Pipeline) -> None:
    from stepscope.metrics.exporters.prometheus import PrometheusEndpoint

    endpoint = PrometheusEndpoint(port=0)
    pipeline.add_exporter(endpoint)  # interval_s=60: only the step declaration can export now
    schedule = stepscope.schedule(wait=1, warmup=1, active=1)
    with stepscope.profile(schedule=schedule, activities=[stepscope.ProfilerActivity.CPU]) as prof:
        assert current_step() == 0  # (an earlier loop's last step may be served until now)
        deadline = time.monotonic() + 5
        while "stepscope_step 0.0" not in scrape(endpoint.url):
            assert time.monotonic() < deadline, scrape(endpoint.url)
            time.sleep(0.02)
        prof.step()
    pipeline.flush(10)
    assert "stepscope_step 1.0" in scrape(endpoint.url)  # kept after the loop ended


@pytest.mark.implementation_independent
def test_prometheus_shows_which_step_a_scalar_belongs_to(
    prometheus_stack: PrometheusStack,  # noqa: F811
    tmp_path: Path,
) -> None:
    from stepscope.metrics.exporters.prometheus import PrometheusEndpoint

    p = Pipeline(interval_s=0.2, handle_sigterm=False, spill_dir=tmp_path)
    try:
        p.add_exporter(PrometheusEndpoint(port=prometheus_stack.endpoint_port))
        loss = p.scalar("train.loss")
        for step, v in enumerate((4.0, 2.0, 1.5)):
            set_step(step)
            loss.bind(rank="0").record(v)
        set_step(3)
        p.flush(10)
        stack = prometheus_stack
        got = stack.wait_for('train_loss_step{rank="0"}', lambda r: _value(r) == 2)
        assert got[0]["metric"]["job"] == "stepscope"
        assert _value(stack.query('train_loss{rank="0"}')) == 1.5
        assert _value(stack.query("stepscope_step")) == 3
    finally:
        p.shutdown(timeout_s=5)
        set_step(None)


@pytest.mark.implementation_independent
def test_statsd_sends_the_step_beside_each_scalar(pipeline: Pipeline) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.5)
    try:
        pipeline.add_exporter(StatsdExporter(*sock.getsockname()))
        record_timed(pipeline, "loss", 4, 0.25)
        set_step(5)
        pipeline.flush(10)
        lines: list[str] = []
        while True:
            try:
                lines += sock.recv(65536).decode().splitlines()
            except TimeoutError:
                break
    finally:
        sock.close()
    assert "loss:0.25|g" in lines
    assert "loss.step:4|g" in lines
    assert "stepscope.step:5|g" in lines


@pytest.mark.implementation_independent
def test_otlp_points_carry_record_time_and_step(pipeline: Pipeline) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from stepscope.metrics.exporters.otlp import OtlpExporter
    from tests.test_metrics_exporters import otlp_receiver

    with otlp_receiver() as (url, requests):
        pipeline.add_exporter(OtlpExporter(url))
        window = record_timed(pipeline, "loss", 11, 0.75)
        time.sleep(EXPORT_DELAY_S)
        set_step(12)
        pipeline.flush(10)
    _, _, request = requests[-1]
    metrics = {
        m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    (loss,) = metrics["loss"].gauge.data_points
    assert loss.as_double == 0.75
    assert_recorded_within(loss.time_unix_nano, window)
    (step,) = metrics["loss.step"].gauge.data_points
    assert step.as_double == 11 and step.time_unix_nano == loss.time_unix_nano
    assert metrics["stepscope.step"].gauge.data_points[0].as_double == 12


def scrape(url: str) -> str:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "identity"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = reply.read()
        if reply.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return str(body.decode())


def _value(result: list[dict[str, Any]]) -> float | None:
    if len(result) != 1:
        return None
    return float(result[0]["value"][1])
