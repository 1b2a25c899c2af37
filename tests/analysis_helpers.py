"""Traces built event by event for the analysis tests (real ``Trace`` objects, no mocks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stepscope.trace.model import Trace, TraceBuilder

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
"""Real torch.profiler traces from GPU, ROCm and MTIA jobs, beside the checkout (read-only)."""

PID, TID = 100, 100
US = 1000


@dataclass
class Kernel:
    """A device event: name, start and duration (µs), launch time (µs, None: no launch)."""

    name: str
    start_us: int
    dur_us: int
    launch_us: int | None = None
    stream: int = 7


@dataclass
class StepSpec:
    """A step of ``dur_us`` with host regions (name, offset µs, duration µs, category)."""

    dur_us: int
    regions: list[tuple[str, int, int, str]] = field(default_factory=list)


def build(
    steps: list[StepSpec],
    kernels: list[Kernel] | None = None,
    metadata: dict[str, object] | None = None,
) -> Trace:
    """A trace with ProfilerStep#N spans, their regions and device events."""
    b = TraceBuilder(base_time_ns=0)
    t = 1_000 * US
    for n, step in enumerate(steps):
        b.span(f"ProfilerStep#{n}", "user_annotation", PID, TID, t, step.dur_us * US)
        for name, offset, dur, cat in step.regions:
            b.span(name, cat, PID, TID, t + offset * US, dur * US)
        t += step.dur_us * US
    for correlation, k in enumerate(kernels or [], start=1):
        if k.launch_us is not None:
            b.span(
                "cudaLaunchKernel",
                "cuda_runtime",
                PID,
                TID,
                k.launch_us * US,
                2 * US,
                {"correlation": correlation},
            )
        args = {"device": 0, "stream": k.stream, "correlation": correlation}
        cat = "gpu_memcpy" if k.name.startswith("Memcpy") else "kernel"
        b.span(k.name, cat, 0, k.stream, k.start_us * US, k.dur_us * US, args)
    b.metadata.update(metadata or {})
    return b.build()
