"""Real Prometheus and Pushgateway processes for the metrics tests (started once per session).

They run from the Debian packages ``prometheus`` and ``prometheus-pushgateway`` (installed by
``scripts/install-test-services.sh``), each with its own config and data in a temp dir, on
free ports of 127.0.0.1.  Where the binaries are missing the tests skip, except with
``CI=true``, where a missing server is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import free_port

SCRAPE_INTERVAL = "1s"


@dataclass
class PrometheusStack:
    """Where the servers listen; ``endpoint_port`` is the stepscope endpoint Prometheus scrapes."""

    prometheus_url: str
    pushgateway_url: str
    endpoint_port: int

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query through Prometheus's HTTP API."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.load(reply)
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def wait_for(
        self, expr: str, accept: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``accept(result)``; the last result on timeout, for the message."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if accept(result):
                return result
            time.sleep(0.2)
        raise AssertionError(f"Prometheus never returned the expected {expr!r}; last: {result}")


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], name: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not become ready: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def prometheus_stack() -> Iterator[PrometheusStack]:
    """A Prometheus scraping a stepscope endpoint port and a Pushgateway, torn down after."""
    prometheus = shutil.which("prometheus")
    pushgateway = shutil.which("prometheus-pushgateway")
    if prometheus is None or pushgateway is None:
        _missing(
            "prometheus / prometheus-pushgateway are not installed "
            "(run scripts/install-test-services.sh as root)"
        )
    assert prometheus is not None and pushgateway is not None
    workdir = Path(tempfile.mkdtemp(prefix="stepscope-prometheus-"))
    prom_port, pgw_port, endpoint_port = free_port(), free_port(), free_port()
    config = workdir / "prometheus.yml"
    config.write_text(
        f"""
global:
  scrape_interval: {SCRAPE_INTERVAL}
  scrape_timeout: {SCRAPE_INTERVAL}
scrape_configs:
  - job_name: stepscope
    static_configs:
      - targets: ["127.0.0.1:{endpoint_port}"]
  - job_name: pushgateway
    honor_labels: true
    static_configs:
      - targets: ["127.0.0.1:{pgw_port}"]
"""
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pgw_log = workdir / "pushgateway.log"
        with open(pgw_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        pushgateway,
                        f"--web.listen-address=127.0.0.1:{pgw_port}",
                        f"--persistence.file={workdir / 'pushgateway.data'}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        prom_log = workdir / "prometheus.log"
        with open(prom_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait_ready(f"http://127.0.0.1:{pgw_port}/-/ready", procs[0], "pushgateway", pgw_log)
        _wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", procs[1], "prometheus", prom_log)
        yield PrometheusStack(
            f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{pgw_port}", endpoint_port
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
