"""Trace writing: 1M span events to .json and .json.gz, and torch's export_chrome_trace beside us.

Targets (issue 2): >= 1M events/s to .json; gzip in one pass <= 2x the plain-JSON time;
<= 120 bytes/event uncompressed.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from harness import Report
from stepscope.trace import Trace, TraceBuilder, read_chrome_trace, write_chrome_trace

NAMES = [
    "train.py(42): forward",
    "model.py(118): Block.__call__",
    "model.py(77): attention",
    "aten::linear",
    "aten::addmm",
    "ProfilerStep#12",
    "data.py(31): __next__",
    "optim.py(200): step",
]


def synthetic_trace(n: int) -> Trace:
    """n nested spans on 4 threads, names from a realistic small vocabulary."""
    b = TraceBuilder(base_time_ns=1_790_000_000_000_000_000)
    pid = 12345
    name_ids = [b.intern(name) for name in NAMES]
    cat_ids = [b.intern(c) for c in ("python_function", "cpu_op", "user_annotation")]
    cols: tuple[list[int], ...] = ([], [], [], [], [], [])
    t = 4_000_000_000_000
    for i in range(n):
        cols[0].append(name_ids[i % len(name_ids)])
        cols[1].append(cat_ids[i % 3])
        cols[2].append(pid)
        cols[3].append(pid + i % 4)
        cols[4].append(t)
        cols[5].append(1_000 + (i * 7919) % 50_000)
        t += 733
    b.extend_spans(*cols)
    return b.build()


def time_write(trace: Trace, path: Path) -> tuple[float, int]:
    start = time.perf_counter()
    write_chrome_trace(trace, path)
    return time.perf_counter() - start, path.stat().st_size


def torch_trace(events_wanted: int, out: Path) -> tuple[float, int, int] | None:
    """Profile many tiny torch ops; (export seconds, bytes, events), or None without torch."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    x = torch.ones(4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(events_wanted):
            x.add_(1)
    start = time.perf_counter()
    prof.export_chrome_trace(str(out))
    elapsed = time.perf_counter() - start
    import json

    events = len(json.loads(out.read_text())["traceEvents"])
    return elapsed, out.stat().st_size, events


def run(report: Report) -> None:
    """Run the trace-writing benchmark."""
    n = 200_000 if report.quick else 1_000_000
    repeat = 3 if report.quick else 5
    trace = synthetic_trace(n)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        plain_times, gz_times = [], []
        plain_size = gz_size = 0
        for _ in range(repeat):
            elapsed, plain_size = time_write(trace, d / "t.json")
            plain_times.append(elapsed)
            elapsed, gz_size = time_write(trace, d / "t.json.gz")
            gz_times.append(elapsed)
        plain = report.add(f"write {n} spans", "stepscope .json", "s", plain_times)
        gz = report.add(f"write {n} spans", "stepscope .json.gz", "s", gz_times)
        report.add(f"write {n} spans", "stepscope .json", "events/s", [n / t for t in plain_times])
        report.add(f"write {n} spans", "stepscope .json.gz", "events/s", [n / t for t in gz_times])
        report.note(f"bytes/event: .json {plain_size / n:.1f}, .json.gz {gz_size / n:.1f}")
        report.target(
            "events/s to .json >= 1M (as seconds per 1M events)", plain.median * 1e6 / n, 1.0
        )
        report.target("gzip time / plain time <= 2", gz.median / plain.median, 2.0)
        report.target("bytes/event uncompressed <= 120", plain_size / n, 120.0)
        os.unlink(d / "t.json")
        os.unlink(d / "t.json.gz")

        torch_events = 20_000 if report.quick else 100_000
        result = torch_trace(torch_events, d / "torch.json")
        if result is None:
            report.note("torch not installed: torch comparison skipped")
            return
        torch_s, torch_bytes, events = result
        same = read_chrome_trace(d / "torch.json")
        ours_times = []
        for _ in range(repeat):
            elapsed, ours_bytes = time_write(same, d / "ours.json")
            ours_times.append(elapsed)
        theirs = report.add(
            f"export {events} torch events",
            "torch export_chrome_trace",
            "events/s",
            [events / torch_s],
        )
        ours = report.add(
            f"export {events} torch events",
            "stepscope .json",
            "events/s",
            [events / t for t in ours_times],
        )
        report.ratio("events/s, same events (higher is better)", ours, theirs)
        report.note(
            f"same events, bytes/event: torch {torch_bytes / events:.1f}, "
            f"stepscope {ours_bytes / events:.1f} (ratio {ours_bytes / torch_bytes:.2f})"
        )
