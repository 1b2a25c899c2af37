"""One tracer in its own process: record a workload, stop, write a ``.json`` trace.

Usage: python bench/tracer_child.py SUBJECT WORKLOAD OUT.json   (imports happen before timing)

Prints one JSON line: seconds from start to the last call (``record``), to the end of stop
(``stop``) and to the trace on disk (``total``), the file's bytes and its ``X`` events.
SUBJECT: ``stepscope`` (``stepscope.profile`` with the Python tracer, ``export_chrome_trace``),
``sampler`` (``stepscope.profile`` sampling stacks at 1 kHz, no tracer),
``viztracer`` (``VizTracer(ignore_c_function=True)``: the same Python calls; ``save``),
``cprofile`` (``cProfile``; ``dump_stats``, not a trace), ``floor`` (a no-op C hook on the same
events), ``none`` (the workload alone).
WORKLOAD: ``mixed`` (recursive fib plus small method calls), ``methods`` (method calls only) or
``over_budget`` (more calls than the tracer's default budget keeps).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_tracer import fib, methods

CALLS = {"mixed": 242785 + 800001, "methods": 1400001, "over_budget": 4000001}
"""Python calls each workload makes."""
WORKLOADS: dict[str, Callable[[], object]] = {
    "mixed": lambda: (fib(25), methods(200_000)),  # 242785 + 800001 calls
    "methods": lambda: methods(350_000),  # 1400001 calls
    "over_budget": lambda: methods(1_000_000),  # 4000001 calls: past the default budget
}


def subject_hooks(subject: str, out: str) -> tuple[Callable[[], Any], ...]:
    """(start, stop, save) of a subject."""
    if subject == "stepscope":
        import stepscope

        prof = stepscope.profile(activities=[stepscope.ProfilerActivity.PYTHON], torch_ops=False)
        return prof.start, prof.stop, lambda: prof.export_chrome_trace(out)
    if subject == "sampler":
        import stepscope

        prof = stepscope.profile(
            activities=[stepscope.ProfilerActivity.SAMPLING], sampling_rate_hz=1000, torch_ops=False
        )
        return prof.start, prof.stop, lambda: prof.export_chrome_trace(out)
    if subject == "viztracer":
        from viztracer import VizTracer

        tracer = VizTracer(verbose=0, ignore_c_function=True, tracer_entries=4_000_000)
        return tracer.start, tracer.stop, lambda: tracer.save(out)
    if subject == "cprofile":
        import cProfile

        cprof = cProfile.Profile()
        return cprof.enable, cprof.disable, lambda: cprof.dump_stats(out)
    if subject == "floor":
        from bench_tracer import _floor

        hooks = _floor()
        if hooks is None:
            raise SystemExit("the floor needs bench/hooks built (python bench/hooks/build.py)")
        return hooks[0], hooks[1], (lambda: None)
    if subject == "none":
        return (lambda: None), (lambda: None), (lambda: None)
    raise SystemExit(f"unknown subject {subject!r} (see this script's docstring)")


def x_events(path: str) -> int:
    """``X`` events in a trace file (0 for anything that is not a Chrome trace)."""
    try:
        with open(path, "rb") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return 0
    return sum(1 for e in doc.get("traceEvents", ()) if e.get("ph") == "X")


def main() -> None:
    """Run one subject and print its timings."""
    subject, workload_name, out = sys.argv[1:4]
    workload = WORKLOADS[workload_name]
    start, stop, save = subject_hooks(subject, out)
    t0 = time.perf_counter()
    start()
    workload()
    t1 = time.perf_counter()
    stop()
    t2 = time.perf_counter()
    save()
    t3 = time.perf_counter()
    size = os.path.getsize(out) if os.path.exists(out) else 0
    result = {"record": t1 - t0, "stop": t2 - t1, "total": t3 - t0, "bytes": size}
    result["events"] = x_events(out)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
