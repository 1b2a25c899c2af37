"""stepscope's metrics as a real Prometheus sees them: scraped from the endpoint, and pushed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.metrics import Pipeline
from stepscope.metrics.exporters.prometheus import PrometheusEndpoint, PushgatewayExporter
from stepscope.steps import set_step
from tests.metrics_fixtures.servers import PrometheusStack, prometheus_stack  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.implementation_independent]


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(interval_s=0.2, handle_sigterm=False, spill_dir=tmp_path)
    yield p
    p.shutdown(timeout_s=5)


def value(result: list[dict[str, object]]) -> float | None:
    if len(result) != 1:
        return None
    return float(result[0]["value"][1])  # type: ignore[index]


def test_prometheus_scrapes_the_endpoint(
    prometheus_stack: PrometheusStack,  # noqa: F811
    pipeline: Pipeline,
) -> None:
    pipeline.add_exporter(PrometheusEndpoint(port=prometheus_stack.endpoint_port))
    pipeline.counter("requests", "handled requests").bind(route="/a").inc(3)
    h = pipeline.histogram("latency_seconds", buckets=[0.1, 1.0])
    h.observe(0.05)
    h.observe(0.5)
    loss = pipeline.scalar("train.loss")
    for step, v in enumerate((4.0, 2.0, 1.0)):
        set_step(step)
        loss.record(v)
    set_step(3)
    pipeline.flush(10)
    stack = prometheus_stack
    got = stack.wait_for('requests_total{job="stepscope",route="/a"}', lambda r: value(r) == 3)
    assert got[0]["metric"]["instance"] == f"127.0.0.1:{stack.endpoint_port}"
    assert value(stack.query('latency_seconds_bucket{le="0.1"}')) == 1
    assert value(stack.query('latency_seconds_bucket{le="+Inf"}')) == 2
    assert value(stack.query("latency_seconds_count")) == 2
    assert value(stack.query("train_loss")) == 1.0  # the newest finished step
    assert value(stack.query("stepscope_step")) == 3
    assert value(stack.query('up{job="stepscope"}')) == 1


def test_pushgateway_receives_the_snapshot(
    prometheus_stack: PrometheusStack,  # noqa: F811
    pipeline: Pipeline,
) -> None:
    stack = prometheus_stack
    exporter = PushgatewayExporter(
        stack.pushgateway_url, job="stepscope_push", grouping_key={"instance": "trainer-0"}
    )
    pipeline.add_exporter(exporter)
    pipeline.counter("samples").inc(128)
    pipeline.gauge("lr").set(0.001)
    pipeline.flush(10)
    assert exporter.pushes >= 1
    got = stack.wait_for(
        'samples_total{job="stepscope_push",instance="trainer-0"}', lambda r: value(r) == 128
    )
    assert got[0]["metric"]["job"] == "stepscope_push"
    assert value(stack.query('lr{job="stepscope_push"}')) == 0.001
    assert pipeline.accounting()["pushgateway"]["export_failures"] == 0
