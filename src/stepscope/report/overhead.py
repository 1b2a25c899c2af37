"""The overhead a report states, as text lines (terminal and Markdown share them)."""

from __future__ import annotations

from stepscope.analysis.overhead import MIN_COMPARED
from stepscope.analysis.result import Overhead

__all__ = ["overhead_lines"]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"


def _edge_lines(o: Overhead) -> list[str]:
    """What the window edges cost the loop (older traces: the time between steps)."""
    if o.edges and o.edge_extra_ns is not None:
        saving = (
            f"; {o.edges_saving} still being saved when this trace was written"
            if o.edges_saving
            else ""
        )
        return [
            f"Window edges: {_ms(o.edge_extra_ns)} over {o.edges} edges (the step before each "
            "window start and stop, the step that ended there and the steps after it until "
            "the window was saved, over the median step of their kinds: the profiler's stop "
            f"and its save off the loop included{saving})."
        ]
    between = sum(o.edge_ns.values())
    if between:
        return [f"Between steps: {_ms(between)} (windows started, stopped, collected and saved)."]
    return []


def overhead_lines(o: Overhead | None) -> list[str]:
    """What profiling cost: the recorded steps' slowdown, edge time, collector hook time."""
    if o is None:
        return ["Overhead: not stated (the trace has no step times: not written by stepscope)."]
    cold = f" (and {o.cold_steps} cold first steps left out)" if o.cold_steps else ""
    counts = (
        f"{o.recorded_steps} recorded, {o.unrecorded_steps} warm unrecorded{cold}, "
        f"{o.warmup_steps} warmup steps of this run"
    )
    if o.optimizers_in_turn > 1:
        lines = [
            f"Overhead: no trustworthy comparison in this run: {o.optimizers_in_turn} "
            f"optimizers end steps in turn, and the medians mix their different steps ({counts})."
        ]
    elif not o.settled:
        lines = [
            "Overhead: no trustworthy comparison in this run: the unrecorded steps before the "
            f"window were still getting faster ({counts}); a schedule with more wait steps "
            "gives warm ones to compare with."
        ]
    elif o.slowdown_pct is None and o.recorded_steps and o.unrecorded_steps:
        lines = [
            f"Overhead: too few steps to compare recorded with unrecorded ones ({counts}; "
            f"{MIN_COMPARED} warm ones each are needed: a schedule with wait={MIN_COMPARED + 2} "
            "or more gives them)."
        ]
    elif o.slowdown_pct is None or o.recorded_median_ns is None:
        missing = "unrecorded" if o.recorded_median_ns is not None else "recorded"
        lines = [f"Overhead: no {missing} step to compare with ({counts})."]
    else:
        lines = [
            f"Overhead: recorded steps took {o.slowdown_pct:+.1f}% against unrecorded steps "
            f"(median {_ms(o.recorded_median_ns)} vs {_ms(o.unrecorded_median_ns or 0)}; "
            f"{counts})."
        ]
    lines += _edge_lines(o)
    if o.in_steps_ns:
        listed = ", ".join(f"{name} {_ms(ns)}" for name, ns in sorted(o.in_steps_ns.items()))
        lines.append(f"Measured inside the recorded steps: {listed}.")
    if o.collector_ns:
        listed = ", ".join(
            f"{name} {_ms(ns)}"
            for name, ns in sorted(o.collector_ns.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"Collector hooks: {listed}.")
    if o.dropped:
        lines.append(f"Step times dropped (oldest, past the ring): {o.dropped}.")
    return lines
