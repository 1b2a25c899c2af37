"""Metrics hot paths against torchelastic, prometheus_client and the OpenTelemetry SDK, and the
GIL cost of a Prometheus scrape of 1,000 series.

Targets (issue 6), ns per call with the loop included: ``put_metric`` with the Null handler
<= 150 ns, ``@prof`` overhead on a no-op <= 500 ns, ``counter.inc()`` <= 100 ns,
``histogram.observe()`` <= 200 ns; a scrape of 1,000 series stalls the training thread for at
most 1 ms (the longest gap a spinning main thread sees while another process scrapes).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from harness import Report, Result
from stepscope import metrics
from stepscope.clock import now_ns
from stepscope.metrics.exporters.prometheus import PrometheusEndpoint


def loop(fn: Callable[..., object], n: int, args: tuple[object, ...]) -> Callable[[], None]:
    """n calls of fn(*args), spelled out per arity (the loop's own cost is in every number)."""
    if not args:

        def run0() -> None:
            for _ in range(n):
                fn()

        return run0
    if len(args) == 1:
        (a,) = args

        def run1() -> None:
            for _ in range(n):
                fn(a)

        return run1
    a, b = args

    def run2() -> None:
        for _ in range(n):
            fn(a, b)

    return run2


def per_call(
    report: Report, case: str, subject: str, fn: Callable[..., object], n: int, *args: object
) -> Result:
    return report.measure(case, subject, loop(fn, n, args), repeat=7, per_call=n)


def difference(report: Report, case: str, subject: str, a: Result, b: Result) -> Result:
    """Per-repetition a - b (an overhead on top of a baseline)."""
    samples = [x - y for x, y in zip(sorted(a.samples), sorted(b.samples), strict=True)]
    return report.add(case, subject, "ns/call", samples)


def hot_paths(report: Report, n: int) -> None:
    from torch.distributed.elastic.metrics import api as te

    # put_metric with the default (Null) handler
    ours = per_call(report, "put_metric (Null handler)", "stepscope", metrics.put_metric, n, "m", 1)
    theirs = per_call(report, "put_metric (Null handler)", "torchelastic", te.put_metric, n, "m", 1)
    report.ratio("put_metric", ours, theirs)
    report.target("put_metric with the Null handler, ns/call", ours.median, 150)

    # @prof overhead on a no-op function
    def noop() -> None:
        pass

    ours_prof = metrics.prof(noop)
    theirs_prof = te.prof(noop)
    base = per_call(report, "no-op function (baseline)", "python", noop, n)
    ours_wrapped = per_call(report, "@prof no-op", "stepscope", ours_prof, n)
    theirs_wrapped = per_call(report, "@prof no-op", "torchelastic", theirs_prof, n)
    ours_over = difference(report, "@prof overhead", "stepscope", ours_wrapped, base)
    theirs_over = difference(report, "@prof overhead", "torchelastic", theirs_wrapped, base)
    report.ratio("@prof overhead", ours_over, theirs_over)
    report.target("@prof overhead on a no-op function, ns/call", ours_over.median, 500)


def instruments(report: Report, n: int) -> None:
    import prometheus_client
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    pipeline = metrics.Pipeline(handle_sigterm=False)
    registry = prometheus_client.CollectorRegistry()
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    meter = provider.get_meter("bench")

    counter = pipeline.counter("bench_counter")
    prom_counter = prometheus_client.Counter("bench_counter", "c", registry=registry)
    otel_counter = meter.create_counter("bench_counter")
    ours = per_call(report, "counter.inc()", "stepscope", counter.inc, n)
    prom = per_call(report, "counter.inc()", "prometheus_client", prom_counter.inc, n)
    otel = per_call(report, "counter.inc()", "opentelemetry-sdk", otel_counter.add, n, 1)
    report.ratio("counter.inc", ours, prom)
    report.ratio("counter.inc", ours, otel)
    report.target("counter.inc(), ns/call", ours.median, 100)

    bound = counter.bind(rank=0)
    prom_bound = prometheus_client.Counter("bench_bound", "c", ["rank"], registry=registry).labels(
        rank="0"
    )
    attrs = {"rank": "0"}
    ours_b = per_call(report, "labelled counter.inc()", "stepscope", bound.inc, n)
    prom_b = per_call(report, "labelled counter.inc()", "prometheus_client", prom_bound.inc, n)
    otel_b = per_call(
        report, "labelled counter.inc()", "opentelemetry-sdk", otel_counter.add, n, 1, attrs
    )
    report.ratio("labelled counter.inc", ours_b, prom_b)
    report.ratio("labelled counter.inc", ours_b, otel_b)

    histogram = pipeline.histogram("bench_hist")
    exp_histogram = pipeline.histogram("bench_exp", exponential=True)
    prom_hist = prometheus_client.Histogram("bench_hist", "h", registry=registry)
    otel_hist = meter.create_histogram("bench_hist")
    ours_h = per_call(report, "histogram.observe()", "stepscope", histogram.observe, n, 0.3)
    prom_h = per_call(report, "histogram.observe()", "prometheus_client", prom_hist.observe, n, 0.3)
    otel_h = per_call(report, "histogram.observe()", "opentelemetry-sdk", otel_hist.record, n, 0.3)
    per_call(
        report,
        "histogram.observe() (exponential)",
        "stepscope",
        exp_histogram.observe,
        n,
        0.3,
    )
    report.ratio("histogram.observe", ours_h, prom_h)
    report.ratio("histogram.observe", ours_h, otel_h)
    report.target("histogram.observe(), ns/call", ours_h.median, 200)

    scalar = pipeline.scalar("bench_scalar")
    pipeline.ring.set_capacity(10 * n)
    record = scalar.record
    clear = pipeline.ring.items.clear

    def record_in_blocks() -> None:
        # the export thread drains the ring every interval; here every 1,000 records (the
        # clearing is counted too), so the ring never holds a million live tuples for the GC
        for _ in range(n // 1000):
            for _ in range(1000):
                record(0.3)
            clear()

    report.measure(
        "scalar.record() (to the ring, drained)", "stepscope", record_in_blocks, per_call=n
    )
    pipeline.ring.drain()
    pipeline.shutdown()
    provider.shutdown()


SCRAPER = """
import sys, time, urllib.request
url, count, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for _ in range(count):
    with urllib.request.urlopen(url, timeout=30) as reply:
        reply.read()
    time.sleep(pause)  # past the next export, so every scrape renders afresh
"""
INTERVAL_S = 0.2


def longest_stall_ms(url: str | None, scrapes: int, spin_s: float) -> float:
    """Longest gap a spinning main thread sees while another process scrapes ``url``.

    The loop only reads the clock and a flag: a loop that also made system calls (releasing
    the GIL for an instant) would hit CPython's convoy effect and starve every other thread.
    """
    done = threading.Event()
    if url is None:
        timer = threading.Timer(spin_s, done.set)
        timer.start()
    else:
        client = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, url, str(scrapes), str(INTERVAL_S * 1.5)]
        )
        threading.Thread(target=lambda: (client.wait(), done.set()), daemon=True).start()
    longest = 0
    prev = now_ns()
    while not done.is_set():
        t = now_ns()
        if t - prev > longest:
            longest = t - prev
        prev = t
    return longest / 1e6


class HoldMeter:
    """Longest CPU stretch of the scrape thread between two GIL releases (its GIL holds)."""

    def __init__(self) -> None:
        from stepscope.metrics.exporters import prometheus as module

        self.module = module
        self.holds: list[int] = []
        self.local = threading.local()
        self.pause = module.pause_for_others
        self.do_get = module._Handler.do_GET

    def __enter__(self) -> HoldMeter:
        meter = self

        def pause() -> None:
            meter.holds.append(time.thread_time_ns() - meter.local.start)
            meter.pause()
            meter.local.start = time.thread_time_ns()

        def do_get(handler: Any) -> None:
            meter.local.start = time.thread_time_ns()
            try:
                meter.do_get(handler)
            finally:
                meter.holds.append(time.thread_time_ns() - meter.local.start)

        self.module.pause_for_others = pause
        self.module._Handler.do_GET = do_get  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.pause_for_others = self.pause
        self.module._Handler.do_GET = self.do_get  # type: ignore[method-assign]


def scrape_gil(report: Report, quick: bool) -> None:
    import prometheus_client

    series = 1000
    scrapes = 4 if quick else 10
    pipeline = metrics.Pipeline(interval_s=INTERVAL_S, handle_sigterm=False)
    endpoint = PrometheusEndpoint(port=0)
    pipeline.add_exporter(endpoint)
    counter = pipeline.counter("requests")
    for i in range(series):
        counter.bind(worker=i).inc(i)
    pipeline.flush(30)

    registry = prometheus_client.CollectorRegistry()
    prom_counter = prometheus_client.Counter("requests", "r", ["worker"], registry=registry)
    for i in range(series):
        prom_counter.labels(worker=str(i)).inc(i)
    server, _ = prometheus_client.start_http_server(0, "127.0.0.1", registry)
    prom_url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    # 1. the scrape thread's own GIL holds (CPU time between releases; no OS noise)
    reps = 3 if quick else 5
    holds = []
    for _ in range(reps):
        with HoldMeter() as meter:
            longest_stall_ms(endpoint.url, scrapes, 0)
        holds.append(max(meter.holds) / 1e6)
    theirs_hold = []
    for _ in range(reps):
        t0 = time.thread_time_ns()
        prometheus_client.generate_latest(registry)  # what its scrape does in one piece
        theirs_hold.append((time.thread_time_ns() - t0) / 1e6)
    ours_h = report.add(f"longest GIL hold of a scrape, {series} series", "stepscope", "ms", holds)
    theirs_h = report.add(
        f"longest GIL hold of a scrape, {series} series", "prometheus_client", "ms", theirs_hold
    )
    report.ratio("scrape GIL hold", ours_h, theirs_h)
    report.target("scrape of 1,000 series: longest GIL hold, ms", ours_h.median, 1.0)

    # 2. what the training loop sees: its longest stall while another process scrapes
    baseline = [longest_stall_ms(None, 0, 1.0) for _ in range(reps)]
    ours = [longest_stall_ms(endpoint.url, scrapes, 0) for _ in range(reps)]
    theirs = [longest_stall_ms(prom_url, scrapes, 0) for _ in range(reps)]
    report.add("longest loop stall, no scrapes (OS noise)", "python", "ms", baseline)
    label = f"longest loop stall, {scrapes} scrapes x {series} series"
    ours_r = report.add(label, "stepscope", "ms", ours)
    theirs_r = report.add(label, "prometheus_client", "ms", theirs)
    report.ratio("scrape loop stall", ours_r, theirs_r)
    report.note(
        "GIL hold = CPU time of the scrape thread between two releases (render works in chunks "
        "of 50 series and pauses between them); loop stall = the longest gap between two clock "
        "readings of a spinning main thread while a separate process scrapes, which includes "
        "OS scheduling noise (see the no-scrape row)"
    )
    server.shutdown()
    pipeline.shutdown()


def _nothing() -> None:
    pass


def run(report: Report) -> None:
    n = 100_000 if report.quick else 1_000_000
    per_call(report, "empty loop iteration (included in every row)", "python", _nothing, n)
    hot_paths(report, n)
    instruments(report, n)
    scrape_gil(report, report.quick)
