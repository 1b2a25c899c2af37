"""One profiler on a CPU training loop, every iteration timed from outside the profiler.

Usage: python bench/window_edge_child.py SUBJECT OUT_DIR [REPEAT]

The loop: 400 small ``Linear`` layers, forward, backward and an SGD step (about 10,000 torch
events an iteration, 100,000+ in a 12-step window), ``prof.step()`` at each iteration's end,
each iteration (its body and ``step()``) timed with ``perf_counter_ns``.  SUBJECT: ``stepscope``
(``stepscope.profile`` with ``stepscope.trace_handler``) or ``torch`` (``torch.profiler.profile``
with ``tensorboard_trace_handler``), on the same schedule (``wait=WAIT, warmup=1, active=12``).

Prints one JSON line: ``unprofiled_ms`` (the loop's iterations before the profile started),
``times_ms`` (every profiled iteration), ``cpu_ms`` (the loop thread's CPU time in each),
``ends`` (the iterations whose ``step()`` ended a window), ``kinds`` (each iteration's part of
the schedule), the trace files, and for stepscope the edge figure its last trace states
(``stated``) with the iterations it covers.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings
from typing import Any

WAIT, WARMUP, ACTIVE = 64, 1, 12
LAYERS, WIDTH = 400, 8


def main() -> int:
    """Run the loop under one subject; print the timings as JSON."""
    subject, out = sys.argv[1], sys.argv[2]
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(4, WIDTH)

    def body() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    unprofiled = []
    for _ in range(20):
        began = time.perf_counter_ns()
        body()
        unprofiled.append(time.perf_counter_ns() - began)
    period = WAIT + WARMUP + ACTIVE
    iterations = period * repeat + 2
    prof: Any
    if subject == "torch":
        import torch.profiler as tp

        warnings.simplefilter("ignore")  # torch's "clears events at the end of each cycle"
        prof = tp.profile(
            activities=[tp.ProfilerActivity.CPU],
            schedule=tp.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=repeat),
            on_trace_ready=tp.tensorboard_trace_handler(out),
        )
    else:
        import stepscope

        prof = stepscope.profile(
            schedule=stepscope.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=repeat),
            on_trace_ready=stepscope.trace_handler(out),
        )
    times, cpu = [], []
    prof.start()
    for _ in range(iterations):
        began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
        body()
        prof.step()
        times.append(time.perf_counter_ns() - began)
        cpu.append(time.thread_time_ns() - began_cpu)
    prof.stop()
    found: dict[str, Any] = {
        "unprofiled_ms": [t / 1e6 for t in unprofiled],
        "times_ms": [t / 1e6 for t in times],
        "cpu_ms": [t / 1e6 for t in cpu],
        "ends": [r * period + period - 1 for r in range(repeat)],
        "kinds": [_kind(n % period) if n < period * repeat else "none" for n in range(iterations)],
        "files": sorted(os.listdir(out)),
    }
    if subject == "stepscope":
        meta = prof.trace().metadata
        found["events"] = meta.get("stepscope_torch_events")
        found["stated"] = meta["stepscope_overhead"]["edges"]
        found["first_step"] = meta["stepscope_window"]["first_step"]
    found["median_recorded_ms"] = statistics.median(
        t / 1e6 for n, t in enumerate(times) if found["kinds"][n] == "recorded"
    )
    print(json.dumps(found))
    return 0


def _kind(at: int) -> str:
    if at < WAIT:
        return "wait"
    return "warmup" if at < WAIT + WARMUP else "recorded"


if __name__ == "__main__":
    sys.exit(main())
