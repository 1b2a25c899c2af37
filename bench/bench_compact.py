"""The compact trace form beside today's Chrome JSON, side by side in one run (issue 42).

Two windows: the Python-call workload of ``bench_tracer.py`` (fib + method calls under the
function tracer) and a torch window (a small MLP's training steps with torch ops, shapes, memory
and stacks).  For each: bytes per event of ``.json``, ``.json.gz`` and ``.sstrace``, and the time
from the window's ``Trace`` to a written file (encode + write), best of rounds, interleaved (each
round starts with another writer, so no writer always runs in the caches another one left).
Targets: compact <= 4 B/event on the Python-call workload, <= 0.1x the Chrome JSON's bytes on the
torch window, and its write time <= 0.3x the Chrome JSON's.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import stepscope
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.compact_writer import write_compact_trace
from stepscope.trace.model import Trace


def python_window(quick: bool) -> Trace:
    import bench_tracer

    with stepscope.profile(activities=["CPU", "PYTHON"], torch_ops=False) as prof:
        bench_tracer.fib(20 if quick else 24)
        v = bench_tracer.Vec(1.0, 2.0)
        for _ in range(20_000 if quick else 100_000):
            v = v.add(bench_tracer.Vec(0.5, 0.5))
            v.norm2()
    return prof.trace()


def torch_window(quick: bool) -> Trace:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with stepscope.profile(record_shapes=True, profile_memory=True, with_stack=True) as prof:
        for _ in range(5 if quick else 20):
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof.trace()


def measure(name: str, trace: Trace, rounds: int) -> dict[str, float]:
    events = trace.event_count() + len(trace.samples)
    best = {"json": 1e9, "json.gz": 1e9, "sstrace": 1e9}
    sizes = {}
    writers = [
        ("json", write_chrome_trace),
        ("json.gz", write_chrome_trace),
        ("sstrace", write_compact_trace),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # each round starts with the next writer: none always follows the 1 MB gzip write
            for suffix, write in writers[r % 3 :] + writers[: r % 3]:
                path = Path(tmp) / f"w.{suffix}"
                t0 = time.perf_counter()
                write(trace, path)
                best[suffix] = min(best[suffix], time.perf_counter() - t0)
                sizes[suffix] = path.stat().st_size
    print(f"{name}: {events:,} events ({trace})")
    for suffix in best:
        print(
            f"  .{suffix:8s} {sizes[suffix]:>12,} B  {sizes[suffix] / events:7.2f} B/event  "
            f"write {best[suffix] * 1e3:8.1f} ms"
        )
    ratio_b = sizes["sstrace"] / sizes["json"]
    ratio_t = best["sstrace"] / best["json"]
    print(f"  compact/json: bytes {ratio_b:.3f}x, time to written file {ratio_t:.2f}x")
    return {"b_per_event": sizes["sstrace"] / events, "bytes_ratio": ratio_b, "time_ratio": ratio_t}


def main() -> int:
    quick = "--quick" in sys.argv
    rounds = 3 if quick else 5
    py = measure("Python-call workload", python_window(quick), rounds)
    # a torch window writes in a few ms: more rounds, so a loaded machine's spikes fall out
    tw = measure("torch window", torch_window(quick), 4 * rounds)
    ok = py["b_per_event"] <= 4 and tw["bytes_ratio"] <= 0.1
    ok = ok and py["time_ratio"] <= 0.3 and tw["time_ratio"] <= 0.3
    print("targets met" if ok else "targets NOT all met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
