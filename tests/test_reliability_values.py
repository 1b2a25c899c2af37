"""Bad values are counted and skipped, never raised and never aggregated (issue 13, 2 and 9)."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest

from stepscope.metrics import JsonlExporter, Pipeline, StatsdExporter
from stepscope.metrics.failures import failure_counts
from stepscope.steps import set_step
from tests.metrics_fixtures import received

pytestmark = pytest.mark.implementation_independent


def received_lines(sock: socket.socket) -> list[str]:
    return [line for d in received(sock) for line in d.decode().split("\n")]


def test_nan_and_inf_gauges_do_not_stop_statsd(pipeline: Pipeline, udp: socket.socket) -> None:
    exporter = pipeline.add_exporter(StatsdExporter(*udp.getsockname()))
    pipeline.gauge("grad_norm").set(math.nan)
    pipeline.gauge("loss_scale").set(math.inf)
    pipeline.gauge("lr").set(0.5)
    pipeline.counter("steps").bind(worker="a\0b").inc(2)
    before = failure_counts().get("invalid_value", 0)
    pipeline.flush(10)
    lines = [ln for ln in received_lines(udp) if not ln.startswith("stepscope.")]
    assert sorted(lines) == ["lr:0.5|g", "steps:2|c|#worker:a_b"]
    assert exporter.lines_skipped == 2
    assert failure_counts().get("invalid_value", 0) == before + 2
    assert pipeline.accounting()["statsd"]["export_failures"] == 0


def test_statsd_settings_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="port must be an int"):
        StatsdExporter(port="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port must be an int"):
        StatsdExporter(port=70000)
    with pytest.raises(TypeError, match="host must be"):
        StatsdExporter(host=None)  # type: ignore[arg-type]


def test_huge_ints_are_counted_never_raised_never_aggregated(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    out = tmp_path / "m.jsonl"
    pipeline.add_exporter(JsonlExporter(out))
    huge = 10**400
    before = failure_counts().get("invalid_value", 0)
    counter = pipeline.counter("tokens")
    counter.inc(5)
    counter.inc(huge)
    counter.inc(math.inf)
    gauge = pipeline.gauge("depth")
    gauge.set(3)
    gauge.inc(huge)
    other = pipeline.gauge("other")
    other.set(huge)
    hist = pipeline.histogram("lat", buckets=[1.0])
    hist.observe(0.5)
    hist.observe(huge)
    ehist = pipeline.histogram("size", exponential=True)
    ehist.observe(huge)
    ehist.observe(math.inf)  # no finite bucket index
    ehist.observe(2.0)
    counter.inc(-huge)
    loss = pipeline.scalar("loss")
    set_step(0)
    for value in (1.0, huge, 3.0):
        loss.record(value)
    set_step(1)
    pipeline.flush(10)
    assert counter.value() == 5
    assert gauge.raw() == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_name = {r["name"]: r for r in rows}
    assert (by_name["lat"]["count"], by_name["lat"]["sum"], by_name["lat"]["counts"]) == (
        1,
        0.5,
        [1, 0],
    )
    assert (by_name["size"]["count"], by_name["size"]["sum"]) == (1, 2.0)
    scalar = [r for r in rows if r["kind"] == "scalar"]
    assert [(r["value"], r["count"]) for r in scalar] == [(2.0, 2)]
    assert not [r for r in rows if r["name"] == "other"]
    # inc(huge), inc(inf), gauge.inc(huge), other=huge, two observe(huge), record(huge)
    assert failure_counts().get("invalid_value", 0) - before >= 7
    pipeline.shutdown(5)
    acc = pipeline.accounting()["jsonl"]
    assert acc["exported"] + acc["spilled"] + acc["dropped"] == acc["produced"] == 3
    assert acc["dropped_by_reason"] == {"invalid_value": 1}
