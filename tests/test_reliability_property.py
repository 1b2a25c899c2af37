"""Hostile strings and values never raise into the caller, never make an output invalid, and
keep ``exported + spilled + dropped == produced`` (issue 13, the property test).

One pipeline per example feeds every exporter at once: JSON lines, CSV, console, logging,
StatsD (a real UDP socket), the Prometheus endpoint (scraped over HTTP and checked with
``promtool``), OTLP (encoded with the real OTLP protobuf encoder and parsed back) and a failing
handler whose batches go to the spill file.  The file writers outside the pipeline (Chrome
trace, metric table, flame graph SVG, collapsed stacks, speedscope) get the same inputs.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from stepscope import tables
from stepscope.config import config
from stepscope.metrics import (
    ConsoleExporter,
    CsvExporter,
    HandlerExporter,
    JsonlExporter,
    LoggingExporter,
    MetricData,
    MetricHandler,
    OtlpExporter,
    Pipeline,
    PipelineMetricHandler,
    PrometheusEndpoint,
    RetryPolicy,
    StatsdExporter,
)
from stepscope.metrics.spill import SpillFile
from stepscope.report.collapsed import write_collapsed
from stepscope.report.flamegraph import write_flamegraph
from stepscope.report.speedscope import write_speedscope
from stepscope.steps import set_step
from stepscope.tables import MetricTable
from stepscope.trace import TraceBuilder, read_chrome_trace, write_chrome_trace
from tests.metrics_fixtures import received, udp_receiver
from tests.reliability_helpers import check_exposition

pytestmark = pytest.mark.slow

csv.field_size_limit(1 << 30)  # a 1 MB label is a valid, if large, CSV field

PIECES = [
    '"', "'", "\\", "\n", "\r", "\r\n", "\0", "\x1b[31m", "\udce9", "\ud800", "é", "€", "😀",
    "# HELP x y", "{}", ",;=|#:@", "\t", " ", "le", "\ufffe",
]  # fmt: skip
MEGABYTE = "m" * (1 << 20)
hostile = st.lists(
    st.one_of(st.sampled_from([*PIECES, MEGABYTE]), st.text(max_size=8)),
    min_size=1,
    max_size=4,
).map("".join)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.sampled_from([10**400, -(10**400), -1, -5.5, math.nan, math.inf, -math.inf, 0, 2**63]),
)
KINDS = ("counter", "gauge", "histogram", "exp_histogram", "scalar", "put_metric")
operations = st.lists(st.tuples(st.sampled_from(KINDS), hostile, values), max_size=12)


def strict_json(line: bytes | str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


class ProtoExporter(MetricExporter):
    """Encodes each export with the real OTLP protobuf encoder and keeps the bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: list[bytes] = []

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        self.payloads.append(encode_metrics(metrics_data).SerializeToString())
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class Refusing(MetricHandler):
    """A backend that is always down: its batches go to the spill file."""

    def emit(self, metric_data: MetricData) -> None:
        raise ConnectionError("backend down")


STATSD_LINE = re.compile(r"[^:|\n\0]+:-?[0-9][0-9.e+-]*\|(c|g)(\|#[^|\n\0]*)?")


def record(p: Pipeline, ops: Sequence[tuple[str, str, Any]], description: str) -> None:
    counter = p.counter("h_counter", description)
    gauge = p.gauge("h_gauge", description)
    histogram = p.histogram("h_hist", description, buckets=[0.0, 1.0])
    exp_histogram = p.histogram("h_exp", description, exponential=True)
    scalar = p.scalar("h_scalar", description=description)
    handler = PipelineMetricHandler(p)
    for step, (kind, text, value) in enumerate(ops):
        set_step(step)
        if kind == "counter":
            counter.bind(tag=text).inc(value)
        elif kind == "gauge":
            gauge.bind(tag=text).set(value)
        elif kind == "histogram":
            histogram.bind(tag=text).observe(value)
        elif kind == "exp_histogram":
            exp_histogram.bind(tag=text).observe(value)
        elif kind == "scalar":
            scalar.bind(tag=text).record(value)
        else:
            handler.emit(MetricData(1.5, text, text, value))
    set_step(len(ops))


@pytest.mark.implementation_independent
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations, description=hostile)
def test_every_exporter_survives_hostile_input(
    ops: list[tuple[str, str, Any]], description: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("exporters")
    udp = udp_receiver()
    console = io.StringIO()
    proto = ProtoExporter()
    p = Pipeline(
        interval_s=60,
        handle_sigterm=False,
        spill_dir=tmp / "spill",
        retry=RetryPolicy(attempts=1, initial_backoff_s=0, max_backoff_s=0),
    )
    try:
        p.add_exporter(JsonlExporter(tmp / "m.jsonl"))
        p.add_exporter(CsvExporter(tmp / "m.csv"))
        p.add_exporter(ConsoleExporter(console))
        p.add_exporter(LoggingExporter(logging.getLogger("stepscope.test.hostile")))
        p.add_exporter(StatsdExporter(*udp.getsockname()))
        endpoint = p.add_exporter(PrometheusEndpoint(port=0))
        p.add_exporter(OtlpExporter(exporter=proto))
        p.add_exporter(HandlerExporter(Refusing()), name="down")
        record(p, ops, description)  # never raises
        p.flush(30)
        with urllib.request.urlopen(endpoint.url, timeout=30) as reply:
            check_exposition(reply.read())
        p.shutdown(30)
        for name, acc in p.accounting().items():
            assert acc["exported"] + acc["spilled"] + acc["dropped"] == acc["produced"], name
        for line in (tmp / "m.jsonl").read_bytes().splitlines():
            strict_json(line)
        with open(tmp / "m.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        assert all(len(r) == 10 for r in rows)
        for row in rows[1:]:
            if row[3]:
                assert isinstance(strict_json(row[3]), dict)
        for datagram in received(udp):
            for statsd_line in datagram.decode("utf-8").split("\n"):
                assert STATSD_LINE.fullmatch(statsd_line), statsd_line[:200]
        for payload in proto.payloads:
            ExportMetricsServiceRequest.FromString(payload)
        console.getvalue().encode("utf-8")
        spill = tmp / "spill"
        for path in spill.glob("*.jsonl") if spill.exists() else []:
            for line in path.read_bytes().splitlines():
                strict_json(line)
    finally:
        p.shutdown(5)
        udp.close()
        set_step(None)


TABLE = MetricTable.register_table("test_hostile", ["text", "value"])
frames = st.lists(hostile, min_size=1, max_size=3)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(texts=st.lists(hostile, min_size=1, max_size=4), value=values, stack=frames)
def test_every_file_writer_survives_hostile_input(
    texts: list[str], value: Any, stack: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("writers")
    # Chrome trace: names, categories and args
    b = TraceBuilder()
    for i, text in enumerate(texts):
        b.span(text, text, 1, 1, i * 1000, 500, {text: value, "v": value})
    write_chrome_trace(b.build(), tmp / "t.json")
    strict_json((tmp / "t.json").read_bytes())
    read_chrome_trace(tmp / "t.json")
    # metric table (CSV)
    with config.patch(tables_dir=str(tmp), metric_tables="test_hostile", run_name=texts[0]):
        try:
            for text in texts:

                def row(text: str = text) -> dict[str, str | float]:
                    return {"text": text, "value": value}

                TABLE.add_row(row)
        finally:
            TABLE.close()
    with open(tmp / "metric_table_test_hostile.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert len(rows) == 1 + len(texts) and all(len(r) == 3 for r in rows)
    # spill file (JSON lines)
    spill = SpillFile(tmp / "spill", texts[0], 1 << 30)
    assert spill.write([{"text": t, "value": value} for t in texts]) is None
    for line in spill.path.read_bytes().splitlines():
        strict_json(line)
    # flame graph SVG, collapsed stacks and speedscope from the same frames
    stacks = {";".join(stack): 3, ";".join(texts): 2}
    write_flamegraph(stacks, tmp / "f.svg", title=texts[0])
    ET.fromstring((tmp / "f.svg").read_bytes())
    lines = write_collapsed(stacks, tmp / "s.txt")
    collapsed = (tmp / "s.txt").read_bytes().decode("utf-8").split("\n")[:-1]  # as tools split
    assert len(collapsed) == lines and all(re.fullmatch(r".* \d+", ln) for ln in collapsed)
    sampled = TraceBuilder()
    frame_ids = [sampled.frame(name, "f.py", 1) for name in stack]
    sampled.sample(1, 1, 0, sampled.stack(frame_ids), 1, False)
    write_speedscope(sampled.build(), tmp / "s.speedscope.json")
    strict_json((tmp / "s.speedscope.json").read_bytes())
    tables.REGISTERED_METRIC_TABLES["test_hostile"].close()
