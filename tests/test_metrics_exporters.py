"""Exporters against real sinks: files, console, logging, UDP StatsD, HTTP scrapes, OTLP/HTTP."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import logging
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stepscope.metrics import (
    ConsoleExporter,
    CsvExporter,
    HandlerExporter,
    JsonlExporter,
    LoggingExporter,
    MetricData,
    MetricHandler,
    Pipeline,
    StatsdExporter,
)
from stepscope.metrics.exporters.statsd import pack
from stepscope.metrics.points import ExportBatch, Family, SeriesPoint
from stepscope.steps import set_step
from tests.metrics_fixtures import free_port, received

pytestmark = pytest.mark.implementation_independent


def record_some(p: Pipeline) -> None:
    p.counter("requests").bind(route="/a").inc(3)
    p.histogram("latency", buckets=[0.1, 1.0]).observe(0.5)
    loss = p.scalar("loss")
    set_step(0)
    loss.record(2.0)
    loss.record(4.0)
    set_step(1)


# ---------------------------------------------------------------------- files


def test_jsonl_rows(pipeline: Pipeline, tmp_path: Path) -> None:
    out = tmp_path / "metrics.jsonl"
    pipeline.add_exporter(JsonlExporter(out))
    record_some(pipeline)
    assert pipeline.flush(10)
    pipeline.counter("requests").bind(route="/a").inc(0)  # unchanged: not written again
    assert pipeline.flush(10)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    scalar = [r for r in rows if r["kind"] == "scalar"]
    assert scalar[0] | {"time_unix_ns": 0} == {
        "time_unix_ns": 0,
        "kind": "scalar",
        "name": "loss",
        "labels": {},
        "step": 0,
        "value": 3.0,
        "count": 2,
        "reduce": "mean",
    }
    counters = [r for r in rows if r["name"] == "requests"]
    assert [(c["labels"], c["value"]) for c in counters] == [({"route": "/a"}, 3.0)]
    (hist,) = [r for r in rows if r["name"] == "latency"]
    assert (hist["counts"], hist["bounds"], hist["sum"]) == ([0, 1, 0], [0.1, 1.0], 0.5)


def test_jsonl_rotates_by_size_and_keeps_whole_lines(tmp_path: Path) -> None:
    out = tmp_path / "rot.jsonl"
    p = Pipeline(interval_s=60, handle_sigterm=False)
    p.add_exporter(JsonlExporter(out, max_bytes=2000, backups=2))
    s = p.scalar("v", "last")
    for step in range(100):
        set_step(step)
        s.record(float(step))
        p._cycle(close_all=True, final=False)
    p.shutdown(timeout_s=5)
    set_step(None)
    files = sorted(tmp_path.glob("rot.jsonl*"))
    assert [f.name for f in files] == ["rot.jsonl", "rot.jsonl.1", "rot.jsonl.2"]
    steps = []
    for f in files:
        assert f.stat().st_size <= 2000
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] == "scalar":
                steps.append(row["step"])
    assert steps and max(steps) == 99 and min(steps) > 0  # the oldest file was rotated away
    assert sorted(steps) == list(range(min(steps), 100))  # the newest steps, none repeated


def test_csv_header_rows_and_rotation(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    p = Pipeline(interval_s=60, handle_sigterm=False)
    p.add_exporter(CsvExporter(out, max_bytes=400, backups=1))
    record_some(p)
    p.flush(10)
    s = p.scalar("loss")
    for step in range(2, 12):
        set_step(step)
        s.record(1.0)
        p._cycle(close_all=True, final=False)
    p.shutdown(timeout_s=5)
    set_step(None)
    for f in (out, tmp_path / "m.csv.1"):
        rows = list(csv.DictReader(io.StringIO(f.read_text())))
        assert rows, f
        assert list(rows[0]) == [
            "time_unix_ns",
            "kind",
            "name",
            "labels",
            "step",
            "value",
            "count",
            "sum",
            "min",
            "max",
        ]
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert rows[-1]["kind"] in ("scalar", "counter", "gauge")
    assert all(r["time_unix_ns"].isdigit() for r in rows)


def test_csv_cells(pipeline: Pipeline, tmp_path: Path) -> None:
    out = tmp_path / "cells.csv"
    pipeline.add_exporter(CsvExporter(out))
    record_some(pipeline)
    pipeline.flush(10)
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert rows["requests"]["labels"] == '{"route":"/a"}' and rows["requests"]["value"] == "3.0"
    assert (rows["latency"]["count"], rows["latency"]["sum"], rows["latency"]["max"]) == (
        "1",
        "0.5",
        "0.5",
    )
    assert (rows["loss"]["step"], rows["loss"]["value"]) == ("0", "3.0")


def test_bad_file_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        JsonlExporter(tmp_path / "x", max_bytes=0)
    with pytest.raises(ValueError, match="backups"):
        CsvExporter(tmp_path / "x", backups=-1)


# ---------------------------------------------------------------------- console, logging, handlers


def test_console_and_logging(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    pipeline.add_exporter(ConsoleExporter(stream))
    pipeline.add_exporter(LoggingExporter("test.metrics"))
    record_some(pipeline)
    with caplog.at_level(logging.INFO, logger="test.metrics"):
        pipeline.flush(10)
    lines = stream.getvalue().splitlines()
    assert any(line.endswith("[step 0]: loss=3.0") for line in lines)
    # series lines carry the step of the snapshot; the step gauge is a series like any other
    assert any(line.endswith("[counter][step 1]: requests{route=/a}=3.0") for line in lines)
    assert any(line.endswith("[histogram][step 1]: latency=count=1 sum=0.5") for line in lines)
    assert any(line.endswith("[gauge][step 1]: stepscope.step=1.0") for line in lines)
    logged = [r.getMessage() for r in caplog.records if r.name == "test.metrics"]
    assert sorted(logged) == sorted(lines)


def test_seed_handlers_become_exporters(pipeline: Pipeline) -> None:
    got: list[tuple[MetricData, str]] = []

    class Keep(MetricHandler):
        def emit(self, metric_data: MetricData) -> None:
            got.append((metric_data, threading.current_thread().name))

    pipeline.add_exporter(HandlerExporter(Keep(), group="trainer"))
    record_some(pipeline)
    pipeline.flush(10)
    by_name = {d.name: d for d, _ in got}
    assert by_name["loss"].value == 3.0 and by_name["loss"].group_name == "trainer"
    assert by_name["requests{route=/a}"].value == 3.0
    assert by_name["latency"].value == 1  # histograms report their count
    assert {thread for _, thread in got} == {"stepscope-metrics-export"}


# ---------------------------------------------------------------------- statsd


def test_dogstatsd_aggregates_per_interval(pipeline: Pipeline, udp: socket.socket) -> None:
    exporter = StatsdExporter(*udp.getsockname(), prefix="job.")
    pipeline.add_exporter(exporter)
    c = pipeline.counter("requests").bind(route="/a")
    for _ in range(5):
        c.inc()  # five increments, one line
    pipeline.gauge("lr").set(0.5)
    h = pipeline.histogram("lat", buckets=[1.0])
    h.observe(0.25)
    h.observe(0.75)
    pipeline.flush(10)
    c.inc(2)
    pipeline.flush(10)
    pipeline.flush(10)  # nothing changed: nothing sent
    lines = [line for d in received(udp) for line in d.decode().split("\n")]
    lines = [line for line in lines if "stepscope.step:" not in line]  # an earlier test's step
    assert lines == [
        "job.requests:5|c|#route:/a",
        "job.lr:0.5|g",
        "job.lat.count:2|c",
        "job.lat.sum:1|c",
        "job.lat.avg:0.5|g",
        "job.requests:2|c|#route:/a",
    ]


def test_plain_statsd_tags_and_packing(pipeline: Pipeline, udp: socket.socket) -> None:
    exporter = StatsdExporter(*udp.getsockname(), flavor="statsd", max_datagram=64)
    pipeline.add_exporter(exporter)
    g = pipeline.gauge("queue_depth_of_some_long_named_queue")
    for worker in range(6):
        g.bind(worker=worker).set(worker)
    pipeline.flush(10)
    datagrams = received(udp)
    assert len(datagrams) == exporter.datagrams_sent >= 2
    lines = [line for d in datagrams for line in d.decode().split("\n")]
    assert all(len(d) <= 64 for d in datagrams if b"\n" in d)
    lines = [line for line in lines if not line.startswith("stepscope.step:")]  # earlier tests'
    assert sorted(lines) == [
        f"queue_depth_of_some_long_named_queue;worker={w}:{w}|g" for w in range(6)
    ]
    assert pack(["a" * 100, "b"], 64) == [b"a" * 100, b"b"]
    with pytest.raises(ValueError, match="flavor"):
        StatsdExporter(flavor="graphite")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- prometheus rendering


def test_render_text_and_openmetrics_parse_back() -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families

    from stepscope.metrics.exporters.prometheus import render

    p = Pipeline(interval_s=60, handle_sigterm=False)
    record_some(p)
    p.histogram("sizes", exponential=True, scale=0).observe(3.0)
    p.gauge("temp.celsius").bind(gpu=0).set(71.5)
    families = p.registry.families(lambda: None)
    text, ctype = render(families)
    assert ctype.startswith("text/plain")
    parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert parsed["requests"].type == "counter"
    assert parsed["requests"].samples[0].value == 3.0
    assert parsed["requests"].samples[0].labels == {"route": "/a"}
    latency = {(s.name, s.labels.get("le")): s.value for s in parsed["latency"].samples}
    assert latency[("latency_bucket", "0.1")] == 0
    assert latency[("latency_bucket", "1.0")] == 1
    assert latency[("latency_bucket", "+Inf")] == 1
    assert latency[("latency_sum", None)] == 0.5
    sizes = {s.labels.get("le"): s.value for s in parsed["sizes"].samples if "le" in s.labels}
    assert sizes == {"4.0": 1.0, "+Inf": 1.0}
    assert parsed["temp_celsius"].samples[0].value == 71.5
    om, om_type = render(families, "application/openmetrics-text; version=1.0.0")
    assert om_type.startswith("application/openmetrics-text")
    assert om.endswith(b"# EOF\n") and om.count(b"# EOF") == 1
    assert {f.name for f in om_parse(om.decode())} >= {"requests", "latency", "sizes"}
    p.shutdown()


def test_render_in_chunks_matches_prometheus_client_in_one_go() -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from stepscope.metrics.exporters.prometheus import SnapshotCollector, render, to_prometheus

    families = [
        Family(
            "big",
            "counter",
            "many series",
            "",
            tuple(SeriesPoint((("i", str(i)),), float(i)) for i in range(1000)),
        ),
        Family("small", "gauge", "", "", (SeriesPoint((), 1.0),)),
    ]
    whole = [m for m, _ in to_prometheus(families)]
    assert len(whole) > 2  # the big family was split into parts
    merged = whole[0]
    for part in whole[1:-1]:
        merged.samples.extend(part.samples)
    one_go = SnapshotCollector([merged, whole[-1]])
    assert render(families)[0] == generate_latest(one_go)  # type: ignore[arg-type]
    om = render(families, "application/openmetrics-text; version=1.0.0")[0]
    assert om == om_latest(one_go)
    assert render(families)[0].count(b"# TYPE big_total counter") == 1


# ---------------------------------------------------------------------- the endpoint


def scrape(url: str, accept: str = "", gzip_ok: bool = False) -> tuple[str, str]:
    headers = {"Accept": accept} if accept else {}
    if gzip_ok:
        headers["Accept-Encoding"] = "gzip"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body.decode(), r.headers["Content-Type"]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_endpoint_serves_text_openmetrics_and_gzip(pipeline: Pipeline) -> None:
    from stepscope.metrics.exporters.prometheus import PrometheusEndpoint

    endpoint = PrometheusEndpoint(port=0)
    assert endpoint.owner and endpoint.port > 0
    pipeline.add_exporter(endpoint)
    record_some(pipeline)
    pipeline.flush(10)
    text, ctype = scrape(endpoint.url)
    assert ctype.startswith("text/plain")
    got = samples(text)
    assert got[("requests_total", frozenset({("route", "/a")}))] == 3
    assert got[("loss", frozenset())] == 3.0
    assert got[("stepscope_step", frozenset())] == 1
    om, om_type = scrape(endpoint.url, "application/openmetrics-text; version=1.0.0", True)
    assert om_type.startswith("application/openmetrics-text") and om.endswith("# EOF\n")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/nope", timeout=5)
    assert err.value.code == 404


def test_port_held_by_something_else_is_a_clear_error() -> None:
    from stepscope.metrics.exporters.prometheus import PrometheusEndpoint

    class NotStepscope(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    holder = ThreadingHTTPServer(("127.0.0.1", 0), NotStepscope)
    threading.Thread(target=holder.serve_forever, args=(0.05,), daemon=True).start()
    try:
        with pytest.raises(OSError, match="not a stepscope metrics endpoint"):
            PrometheusEndpoint(port=holder.server_address[1])
    finally:
        holder.shutdown()
        holder.server_close()
    with pytest.raises(ValueError, match="port"):
        PrometheusEndpoint(port=70000)


RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    from stepscope import metrics
    from stepscope.metrics.exporters.prometheus import PrometheusEndpoint

    endpoint = PrometheusEndpoint(port=int(sys.argv[1]))
    print("owner" if endpoint.owner else "forwarder", flush=True)
    metrics.configure_pipeline(interval_s=0.05)
    metrics.add_exporter(endpoint)
    metrics.counter("requests").bind(route="/a").inc(10)
    metrics.gauge("memory", merge="sum").set(100)
    metrics.flush(10)
    sys.stdin.readline()  # the test scrapes while we are alive, then lets us exit
    """
)


def test_processes_on_one_host_merge_into_one_endpoint(pipeline: Pipeline) -> None:
    from stepscope.metrics.exporters.prometheus import PrometheusEndpoint

    port = free_port()
    endpoint = PrometheusEndpoint(port=port)
    pipeline.add_exporter(endpoint)
    pipeline.counter("requests").bind(route="/a").inc(1)
    pipeline.gauge("memory", merge="sum").set(5)
    pipeline.flush(10)
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK_SCRIPT, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None and rank.stdin is not None
        assert rank.stdout.readline().strip() == "forwarder"
        key = ("requests_total", frozenset({("route", "/a")}))
        deadline = 50
        while samples(scrape(endpoint.url)[0]).get(key) != 11 and deadline:
            threading.Event().wait(0.1)
            deadline -= 1
        live = samples(scrape(endpoint.url)[0])
        assert live[key] == 11
        assert live[("memory", frozenset())] == 105
        rank.stdin.write("\n")
        rank.stdin.flush()
        assert rank.wait(20) == 0
    finally:
        if rank.poll() is None:
            rank.kill()
    pipeline.counter("requests").bind(route="/a").inc(1)
    pipeline.gauge("memory", merge="sum").set(6)
    pipeline.flush(10)
    after = samples(scrape(endpoint.url)[0])
    assert after[key] == 12  # the exited process's total is kept, not lost or piled up
    assert after[("memory", frozenset())] == 6  # its gauge left with it


def test_merge_rules() -> None:
    from stepscope.metrics.exporters.prometheus import merge_processes
    from stepscope.metrics.points import HistogramValue

    def fam(kind: Any, value: Any, merge: str = "last") -> list[Family]:
        return [Family("m", kind, "", "", (SeriesPoint((), value),), merge)]

    assert (
        merge_processes([(fam("counter", 2.0), 1), (fam("counter", 3.0), 2)])[0].points[0].value
        == 5.0
    )
    for merge, expected in (("last", 7.0), ("max", 9.0), ("min", 7.0), ("sum", 16.0)):
        views = [(fam("gauge", 9.0, merge), 1), (fam("gauge", 7.0, merge), 2)]
        assert merge_processes(views)[0].points[0].value == expected
    h1 = HistogramValue((1.0,), (1, 0), 0.5, 1, 0.5, 0.5)
    h2 = HistogramValue((1.0,), (0, 2), 6.0, 2, 2.0, 4.0)
    merged = merge_processes([(fam("histogram", h1), 1), (fam("histogram", h2), 2)])
    assert merged[0].points[0].value == HistogramValue((1.0,), (1, 2), 6.5, 3, 0.5, 4.0)


# ---------------------------------------------------------------------- OpenTelemetry


class OtlpReceiver(BaseHTTPRequestHandler):
    """A local OTLP/HTTP endpoint that decodes each request with opentelemetry-proto."""

    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append((self.path, self.headers["Content-Type"], request))
        reply = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[Any]]]:
    """A running local OTLP/HTTP receiver: its metrics URL and the requests it decoded."""
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), OtlpReceiver)
    server.requests = []
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", server.requests
    finally:
        server.shutdown()
        server.server_close()


def test_otlp_http_exporter_to_a_local_receiver(pipeline: Pipeline) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from stepscope.metrics.exporters.otlp import OtlpExporter

    with otlp_receiver() as (url, requests):
        pipeline.add_exporter(OtlpExporter(url, resource_attributes={"job": "train"}))
        record_some(pipeline)
        pipeline.histogram("sizes", exponential=True, scale=1).observe(3.0)
        pipeline.flush(10)
        pipeline.shutdown(timeout_s=5)
    path, ctype, request = requests[-1]
    assert path == "/v1/metrics" and ctype == "application/x-protobuf"
    (rm,) = request.resource_metrics
    resource = {a.key: a.value.string_value for a in rm.resource.attributes}
    assert resource["job"] == "train" and resource["service.name"] == "stepscope"
    metrics = {m.name: m for sm in rm.scope_metrics for m in sm.metrics}
    requests = metrics["requests"].sum
    assert requests.is_monotonic and requests.aggregation_temporality == 2  # cumulative
    point = requests.data_points[0]
    assert point.as_double == 3.0
    assert {a.key: a.value.string_value for a in point.attributes} == {"route": "/a"}
    latency = metrics["latency"].histogram.data_points[0]
    assert list(latency.bucket_counts) == [0, 1, 0]
    assert list(latency.explicit_bounds) == [0.1, 1.0]
    assert (latency.count, latency.sum) == (1, 0.5)
    sizes = metrics["sizes"].exponential_histogram.data_points[0]
    assert (sizes.scale, sizes.count, sizes.positive.offset) == (1, 1, 3)  # 3 in (2**1.5, 4]
    assert metrics["loss"].gauge.data_points[0].as_double == 3.0


def test_otel_meter_bridge_with_in_memory_reader(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

    from stepscope.metrics.exporters.otlp import OtelMeterBridge

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    bridge = OtelMeterBridge(provider)
    pipeline.add_exporter(bridge)
    record_some(pipeline)
    pipeline.gauge("lr").set(0.01)
    with caplog.at_level(logging.WARNING, logger="stepscope.metrics"):
        pipeline.flush(10)
    data = reader.get_metrics_data()
    assert data is not None
    found = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }

    def number(name: str) -> NumberDataPoint:
        point = found[name].data.data_points[0]
        assert isinstance(point, NumberDataPoint)
        return point

    point = number("requests")
    assert point.value == 3.0 and dict(point.attributes or {}) == {"route": "/a"}
    assert number("lr").value == 0.01
    assert number("loss").value == 3.0
    assert "latency" in bridge.skipped and "latency" not in found
    assert any("cannot be observed" in r.getMessage() for r in caplog.records)
    provider.shutdown()


def test_export_batch_accounting_property() -> None:
    batch = ExportBatch(0, 0, ())
    assert batch.record_count == 0


def test_metrics_demo_example_runs() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "metrics_demo.py"
    out = subprocess.run(
        [sys.executable, str(example), "--port", "0", "--steps", "5", "--no-torch"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert lines[0].startswith("# scraped http://127.0.0.1:")
    assert "train_samples_total 320.0" in lines
    assert "stepscope_step 5.0" in lines
    assert any(line.startswith("train_loss ") for line in lines)
    assert any(line.startswith('train_step_seconds_bucket{le="+Inf"} 5.0') for line in lines)


def test_jsonl_lines_stay_valid_json_when_a_value_is_nan() -> None:
    from stepscope.metrics.exporters.files import JsonlExporter

    text = JsonlExporter.format(None, [{"name": "loss", "value": float("nan")}])  # type: ignore[arg-type]

    def reject(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    assert json.loads(text, parse_constant=reject) == {"name": "loss", "value": "NaN"}
