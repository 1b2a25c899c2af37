"""Failure modes: backends down (closed port, HTTP 503), fork mid-run, SIGTERM during export."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stepscope.metrics import (
    HandlerExporter,
    JsonlExporter,
    MetricData,
    MetricHandler,
    Pipeline,
    RetryPolicy,
)
from stepscope.metrics.exporters.prometheus import PushgatewayExporter
from stepscope.steps import set_step
from tests.metrics_fixtures import free_port

pytestmark = pytest.mark.implementation_independent


class FlakyBackend(BaseHTTPRequestHandler):
    """Answers 503 until ``server.healthy_after`` requests were made, then 200."""

    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.requests += 1
        status = 200 if self.server.requests > self.server.healthy_after else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_POST = _answer


@pytest.fixture
def flaky_backend() -> Iterator[ThreadingHTTPServer]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), FlakyBackend)
    server.requests = 0
    server.healthy_after = 10**9
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_steps(pipeline: Pipeline, steps: int, per_step: int = 3) -> None:
    s = pipeline.scalar("loss")
    for step in range(steps):
        set_step(step)
        for i in range(per_step):
            s.record(float(step + i))
        time.sleep(0.004)
    set_step(None)


def check_accounting(pipeline: Pipeline, name: str, produced: int) -> dict[str, Any]:
    acc = pipeline.accounting()[name]
    assert acc["produced"] == produced
    assert acc["exported"] + acc["spilled"] + acc["dropped"] == produced, acc
    return acc


def test_pushgateway_on_a_closed_port(tmp_path: Path) -> None:
    p = Pipeline(
        interval_s=0.02,
        handle_sigterm=False,
        spill_dir=tmp_path,
        exporter_timeout_s=0.5,
        retry=RetryPolicy(attempts=2, initial_backoff_s=0.001, max_backoff_s=0.05),
    )
    p.add_exporter(PushgatewayExporter(f"http://127.0.0.1:{free_port()}", grouping_key={}))
    run_steps(p, 30)
    p.shutdown(timeout_s=5)
    acc = check_accounting(p, "pushgateway", 90)
    assert acc["exported"] == 0 and acc["spilled"] == 90
    assert acc["export_failures"] >= 1
    spilled = [json.loads(line) for line in Path(acc["spill_file"]).read_text().splitlines()]
    assert sorted(e["step"] for e in spilled) == list(range(30))
    assert sum(e["count"] for e in spilled) == 90


def test_http_503_then_recovery(tmp_path: Path, flaky_backend: Any) -> None:
    flaky_backend.healthy_after = 4
    p = Pipeline(
        interval_s=0.02,
        handle_sigterm=False,
        spill_dir=tmp_path,
        exporter_timeout_s=0.5,
        retry=RetryPolicy(attempts=2, initial_backoff_s=0.001, max_backoff_s=0.02),
    )
    url = f"http://127.0.0.1:{flaky_backend.server_address[1]}"
    p.add_exporter(PushgatewayExporter(url, grouping_key={}))
    run_steps(p, 40)
    p.shutdown(timeout_s=5)
    acc = check_accounting(p, "pushgateway", 120)
    assert acc["spilled"] > 0 and acc["exported"] > 0
    assert flaky_backend.requests > 4


def test_otlp_backend_answering_503(tmp_path: Path, flaky_backend: Any) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from stepscope.metrics.exporters.otlp import OtlpExporter

    p = Pipeline(
        interval_s=0.05,
        handle_sigterm=False,
        spill_dir=tmp_path,
        exporter_timeout_s=0.3,
        retry=RetryPolicy(attempts=1, initial_backoff_s=0.0, max_backoff_s=0.05),
    )
    url = f"http://127.0.0.1:{flaky_backend.server_address[1]}/v1/metrics"
    p.add_exporter(OtlpExporter(url, timeout_s=0.3))
    run_steps(p, 10)
    p.shutdown(timeout_s=3)
    acc = check_accounting(p, "otlp", 30)
    assert acc["exported"] == 0 and acc["spilled"] + acc["dropped"] == 30
    assert flaky_backend.requests >= 1


def test_raising_handler_used_as_exporter_is_counted_and_spilled(tmp_path: Path) -> None:
    class Broken(MetricHandler):
        def emit(self, metric_data: MetricData) -> None:
            raise ValueError("cannot emit")

    p = Pipeline(
        interval_s=60,
        handle_sigterm=False,
        spill_dir=tmp_path,
        retry=RetryPolicy(attempts=1, initial_backoff_s=0.0),
    )
    p.add_exporter(HandlerExporter(Broken()))
    run_steps(p, 3, per_step=1)
    p.shutdown(timeout_s=5)
    acc = check_accounting(p, "handler", 3)
    assert acc["spilled"] == 3 and acc["export_failures"] >= 1


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_mid_run_child_exports_only_its_own_data(tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    p = Pipeline(interval_s=0.02, handle_sigterm=False, spill_dir=tmp_path)
    p.add_exporter(JsonlExporter(out))
    c = p.counter("work")
    s = p.scalar("loss")
    set_step(0)
    c.inc(5)
    s.record(1.0)
    time.sleep(0.05)  # the export thread is running when we fork
    pid = os.fork()
    if pid == 0:  # the child: its own thread, its own file, none of the parent's values
        code = 1
        faulthandler.dump_traceback_later(20, exit=True)  # never hang the test run
        try:
            c.inc(2)
            s.record(9.0)
            p.shutdown(timeout_s=5)
            code = 0
        finally:
            os._exit(code)
    c.inc(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    p.shutdown(timeout_s=5)
    set_step(None)
    parent_rows = _jsonl(out)
    child_rows = _jsonl(tmp_path / f"m.{pid}.jsonl")
    parent_work = [r["value"] for r in parent_rows if r["name"] == "work"]
    child_work = [r["value"] for r in child_rows if r["name"] == "work"]
    assert parent_work[-1] == 6
    assert child_work == [2]
    assert [r["value"] for r in child_rows if r["kind"] == "scalar"] == [9.0]
    assert [r["value"] for r in parent_rows if r["kind"] == "scalar"] == [1.0]


def _child_work(counter: Any) -> None:
    counter.inc(3)  # no flush, no shutdown: the exit hook (multiprocessing Finalize) exports


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs the fork start method")
def test_multiprocessing_child_is_flushed_at_exit(tmp_path: Path) -> None:
    out = tmp_path / "mp.jsonl"
    p = Pipeline(interval_s=60, handle_sigterm=False, spill_dir=tmp_path)
    p.add_exporter(JsonlExporter(out))
    c = p.counter("jobs")
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_child_work, args=(c,))
    proc.start()
    proc.join(20)
    assert proc.exitcode == 0
    p.shutdown(timeout_s=5)
    child_rows = _jsonl(tmp_path / f"mp.{proc.pid}.jsonl")
    assert [r["value"] for r in child_rows if r["name"] == "jobs"] == [3]
    assert not [r for r in _jsonl(out) if r["name"] == "jobs"] if out.exists() else True


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from stepscope import metrics
    from stepscope.steps import set_step

    class SlowJsonl(metrics.JsonlExporter):
        def export(self, batch, timeout_s):
            if batch.scalars and not batch.final:
                print("exporting", flush=True)
                time.sleep(0.4)  # SIGTERM arrives in here
            super().export(batch, timeout_s)

    metrics.configure_pipeline(interval_s=0.05)
    metrics.add_exporter(SlowJsonl(sys.argv[1]))
    loss = metrics.scalar("loss")
    for step in range(20):
        set_step(step)
        loss.record(float(step))
    time.sleep(30)
    """
)


def test_sigterm_during_export_flushes_and_still_dies_of_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "term.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "exporting"
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM
    rows = _jsonl(out)
    steps = [r["step"] for r in rows if r["kind"] == "scalar"]
    assert sorted(steps) == list(range(20))
