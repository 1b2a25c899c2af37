"""The compact trace form beside today's Chrome JSON, side by side in one run (issue 42).

Two windows: the Python-call workload of ``bench_tracer.py`` (fib + method calls under the
function tracer) and a torch window (a small MLP's training steps with torch ops, shapes, memory
and stacks).  For each: bytes per event of ``.json``, ``.json.gz`` and ``.sstrace``, and the time
from the window's ``Trace`` to a written file (encode + write), best of rounds, interleaved (each
round starts with another writer, so no writer always runs in the caches another one left).
Targets: compact <= 4 B/event on the Python-call workload, <= 0.1x the Chrome JSON's bytes on the
torch window, and its write time <= 0.3x the Chrome JSON's.  Then the window's whole end, from
``prof.stop()`` to the file ``trace_handler`` wrote, for a smaller window of each kind: what the
issue's "time from window end to a written file" names (the collect and build are the same for
either format, and a torch window's end is mostly torch's own stop and Kineto export).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stepscope
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.compact_writer import write_compact_trace
from stepscope.trace.model import Trace
from stepscope.trace.perfetto_writer import write_perfetto_trace


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
    writers: list[tuple[str, Any]] = [
        ("json", write_chrome_trace),
        ("json.gz", write_chrome_trace),
        ("sstrace", write_compact_trace),
    ]
    if importlib.util.find_spec("perfetto") is not None:  # Perfetto's own form, on demand
        writers.append(("pftrace", write_perfetto_trace))
    best = {suffix: 1e9 for suffix, _ in writers}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # each round starts with the next writer: none always follows the 1 MB gzip write
            k = r % len(writers)
            for suffix, write in writers[k:] + writers[:k]:
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


def _python_body(quick: bool) -> None:
    import bench_tracer

    bench_tracer.fib(18 if quick else 20)
    v = bench_tracer.Vec(1.0, 2.0)
    for _ in range(5_000 if quick else 20_000):
        v = v.add(bench_tracer.Vec(0.5, 0.5))
        v.norm2()


def _torch_body(quick: bool) -> Any:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def body(prof: Any) -> None:
        for _ in range(5 if quick else 20):
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()

    return body


def window_end(name: str, quick: bool, rounds: int) -> float:
    """From ``prof.stop()`` to the window's file written by ``trace_handler`` (its save off the
    loop waited for), Chrome JSON against compact, best of ``rounds`` fresh windows each."""
    best = {"chrome": 1e9, "compact": 1e9}
    torch_body = _torch_body(quick) if name == "torch" else None
    options: dict[str, Any] = (
        {"record_shapes": True, "profile_memory": True, "with_stack": True}
        if torch_body is not None
        else {"activities": ["CPU", "PYTHON"], "torch_ops": False}
    )
    for r in range(rounds):
        for fmt in ("chrome", "compact") if r % 2 else ("compact", "chrome"):
            with tempfile.TemporaryDirectory() as tmp:
                prof = stepscope.profile(
                    on_trace_ready=stepscope.trace_handler(tmp, format=fmt), **options
                )
                prof.start()
                if torch_body is not None:
                    torch_body(prof)
                else:
                    _python_body(quick)
                t0 = time.perf_counter()
                prof.stop()
                prof.traces  # noqa: B018 (waits for the save off the loop)
                best[fmt] = min(best[fmt], time.perf_counter() - t0)
    ratio = best["compact"] / best["chrome"]
    print(
        f"{name} window end to written file: chrome {best['chrome'] * 1e3:.1f} ms, compact "
        f"{best['compact'] * 1e3:.1f} ms: {ratio:.2f}x"
    )
    return ratio


def main() -> int:
    quick = "--quick" in sys.argv
    rounds = 3 if quick else 5
    py = measure("Python-call workload", python_window(quick), rounds)
    # a torch window writes in a few ms: more rounds, so a loaded machine's spikes fall out
    tw = measure("torch window", torch_window(quick), 4 * rounds)
    ok = py["b_per_event"] <= 4 and tw["bytes_ratio"] <= 0.1
    ok = ok and py["time_ratio"] <= 0.3 and tw["time_ratio"] <= 0.3
    print("targets met" if ok else "targets NOT all met")
    # the window's whole end: the profile's stop, the collectors' collect, the build and the
    # write (for a torch window, most of it is torch's own stop and its Kineto export, which
    # stepscope reads back: the same for either format)
    window_end("Python-call", quick, rounds + 2)
    window_end("torch", quick, rounds + 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
