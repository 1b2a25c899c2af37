"""Where a profiled GPU loop's extra time goes: cProfile of 40 training steps (20 recorded,
traces written) under stepscope and under torch.profiler, on a machine with a CUDA GPU.

cProfile sees the loop's thread only: stepscope's window end there is its stop (torch's
``_disable_profiler``); the merge, build and write run on the profile's writer thread (a CUDA
session's Kineto result is saved there too, not in a forked child), and their effect on the
loop is in the edge figure printed after each stepscope run (the trace's ``Window edges``).

    python bench/cuda_window_cost.py
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

from cuda_memory_check import train


def main() -> int:
    """Profile both runs; print each one's top functions by cumulative time."""
    import torch
    import torch.profiler

    import stepscope

    if not torch.cuda.is_available():
        print("cuda_window_cost: no CUDA device here")
        return 2
    out = Path(tempfile.mkdtemp())
    train(10, None)

    def ours() -> None:
        with stepscope.profile(
            activities=["CPU", "CUDA"],
            schedule=stepscope.schedule(wait=1, warmup=1, active=20, repeat=1),
            on_trace_ready=stepscope.trace_handler(out / "stepscope"),
        ) as prof:
            train(40, prof.step)
        edges = prof.trace().metadata["stepscope_overhead"]["edges"]
        extra = edges["extra_ns"] / 1e6 if edges["extra_ns"] is not None else float("nan")
        print(f"== stepscope window edges: {extra:.1f} ms over {edges['count']} edges")

    def torchs() -> None:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=20, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out / "torch")),
        ) as prof:
            train(40, prof.step)

    for name, run in (("torch.profiler", torchs), ("stepscope", ours), ("stepscope", ours)):
        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        stats = pstats.Stats(profiler)
        print(f"== {name}: {stats.total_tt * 1e3:.1f} ms in all")  # type: ignore[attr-defined]
        stats.sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
