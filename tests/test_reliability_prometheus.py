"""Prometheus output survives hostile text and colliding names (issue 13, points 1 and 8)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.metrics import Pipeline, PrometheusEndpoint
from stepscope.metrics.exporters.prometheus import render
from stepscope.metrics.points import Family, SeriesPoint, SummaryValue
from tests.reliability_helpers import check_exposition

pytestmark = pytest.mark.implementation_independent


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Pipeline, PrometheusEndpoint]]:
    p = Pipeline(interval_s=60, handle_sigterm=False, spill_dir=tmp_path / "spill")
    endpoint = p.add_exporter(PrometheusEndpoint(port=0))
    yield p, endpoint
    p.shutdown(timeout_s=5)


def scrape(endpoint: PrometheusEndpoint) -> bytes:
    with urllib.request.urlopen(endpoint.url, timeout=10) as reply:
        assert reply.status == 200
        return bytes(reply.read())


def test_a_lone_surrogate_label_is_replaced_not_fatal(
    served: tuple[Pipeline, PrometheusEndpoint],
) -> None:
    p, endpoint = served
    bad = os.fsdecode(b"caf\xe9.txt")  # 'caf\udce9.txt'
    p.gauge("opened", description=f"files like {bad}").bind(path=bad).set(1)
    p.gauge("fine").set(2)
    p.flush()
    body = scrape(endpoint)
    text = body.decode("utf-8")
    assert 'opened{path="caf\ufffd.txt"} 1.0' in text
    assert "fine 2.0" in text
    check_exposition(body)


def test_a_bad_push_is_refused_and_changes_nothing(
    served: tuple[Pipeline, PrometheusEndpoint],
) -> None:
    p, endpoint = served
    p.gauge("fine").set(2)
    p.flush()
    before = scrape(endpoint)
    hostile = [
        {"name": "x", "kind": "gauge", "points": [[[["path", "caf\udce9"]], 1.0]]},
        {"name": "x", "kind": "gauge", "points": [[[["bad name", "v"]], 1.0]]},
        {"name": "x\udce9", "kind": "gauge", "points": [[[], 1.0]]},
    ]
    for family in hostile:
        body = json.dumps({"pid": 4242, "families": [family]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{endpoint.port}/stepscope/v1/push", data=body, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400
    after = scrape(endpoint)
    assert after == before
    check_exposition(after)


def test_colliding_names_give_distinct_families_whatever_the_order() -> None:
    def family(name: str, value: float) -> Family:
        return Family(name, "gauge", "", "", (SeriesPoint((), value),))

    names = ["train.loss", "train-loss", "train_loss"]
    bodies = []
    for order in (names, names[::-1], names[1:] + names[:1]):
        body, _ = render([family(n, float(i)) for i, n in enumerate(order)])
        check_exposition(body)
        bodies.append(body.decode())
    help_lines = [sorted(ln for ln in b.splitlines() if ln.startswith("# HELP")) for b in bodies]
    assert help_lines[0] == help_lines[1] == help_lines[2]
    assert len(help_lines[0]) == 3
    assert "# HELP train_loss train_loss" in help_lines[0]  # the exact name keeps its name
    openmetrics, _ = render([family(n, 1.0) for n in names], accept="application/openmetrics-text")
    assert openmetrics.endswith(b"# EOF\n") and openmetrics.count(b"# EOF") == 1


def test_a_family_that_cannot_be_rendered_is_left_out_not_fatal() -> None:
    good = Family("fine", "gauge", "", "", (SeriesPoint((), 1.0),))
    nameless = Family(
        "", "summary", "", "", (SeriesPoint((), SummaryValue(1.0, 1)),)
    )  # put_metric("")
    body, _ = render([nameless, good])
    check_exposition(body)
    assert b"fine 1.0" in body
