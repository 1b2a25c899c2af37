"""The host breakdown of a trace window's steps, for the step tables' recorded rows (run on the
writer thread, never in ``step()``)."""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.analysis.analyze import analyze_file
from stepscope.trace.model import Trace

__all__ = ["StepBreakdown", "window_breakdown"]


@dataclass(frozen=True)
class StepBreakdown:
    """One recorded step: host computation / communication / idle, and the host categories."""

    computation_ns: int
    communication_ns: int
    """A collective in flight on any thread of the process (waiting for the others included)."""
    idle_ns: int
    categories: dict[str, int]


def window_breakdown(trace: Trace) -> dict[int, StepBreakdown]:
    """Each numbered step of the window, by step number."""
    part = analyze_file("window", trace, None, 1, with_ranks=True)
    categories = {
        hb.step: {c.name: c.ns for c in hb.categories}
        for hb in part.summary.host_steps
        if hb.step is not None
    }
    partitions = part.ranks.partitions if part.ranks is not None else {}
    return {
        step: StepBreakdown(comp, comm, idle, categories.get(step, {}))
        for step, (comp, comm, idle) in partitions.items()
    }
