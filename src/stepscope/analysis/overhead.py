"""The overhead a trace states: its ``stepscope_overhead`` metadata as an ``Overhead``.

stepscope's profile writes the step times of every step so far (recorded or not) into each
window's metadata; traces from elsewhere have none and get ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stepscope.analysis.result import Overhead, TraceSummary
from stepscope.trace.model import Trace

__all__ = ["MIN_COMPARED", "pick_overhead", "stated_overhead", "trace_overhead"]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ns_map(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if _int_or_none(v) is not None}


MIN_COMPARED = 3
"""Steps each side needs before a slowdown is stated: the medians of one or two steps compare
the program's warm-up with its steady state, not recorded with unrecorded steps."""


def trace_overhead(trace: Trace) -> Overhead | None:
    """The trace's stated overhead, or None (no or malformed ``stepscope_overhead``)."""
    return stated_overhead(
        trace.metadata.get("stepscope_overhead"),
        trace.metadata.get("stepscope_step_source"),
        trace.metadata,
    )


def stated_overhead(
    found: Any, source: Any, metadata: Mapping[str, Any] | None = None
) -> Overhead | None:
    """The overhead a step-times summary states (``StepTimes.summary()``, or a trace's
    ``stepscope_overhead``), given the step source; None when it is no such summary."""
    if not isinstance(found, Mapping) or not isinstance(found.get("steps"), Mapping):
        return None
    kinds = found["steps"]

    def stat(kind: str, key: str) -> int | None:
        entry = kinds.get(kind)
        return _int_or_none(entry.get(key)) if isinstance(entry, Mapping) else None

    recorded, unrecorded = stat("recorded", "median_ns"), stat("unrecorded", "median_ns")
    enough = min(stat("recorded", "count") or 0, stat("unrecorded", "count") or 0) >= MIN_COMPARED
    entry = kinds.get("unrecorded")
    settled = not (isinstance(entry, Mapping) and entry.get("settled") is False)
    # steps of several optimizers in turn (a GAN's D and G) differ by kind: medians of the two
    # sides mix them in different proportions and compare nothing
    turn = source.get("optimizers") if isinstance(source, Mapping) else None
    in_turn = isinstance(turn, list) and len(turn) > 1
    slowdown = (
        100.0 * (recorded - unrecorded) / unrecorded
        if recorded is not None and unrecorded and enough and settled and not in_turn
        else None
    )
    edges = found.get("edges")
    edges = edges if isinstance(edges, Mapping) else {}
    return Overhead(
        recorded_steps=stat("recorded", "count") or 0,
        unrecorded_steps=stat("unrecorded", "count") or 0,
        warmup_steps=stat("warmup", "count") or 0,
        recorded_median_ns=recorded,
        unrecorded_median_ns=unrecorded,
        slowdown_pct=slowdown,
        edge_ns=_ns_map(found.get("edge_ns")),
        collector_ns=_ns_map(found.get("collector_ns")),
        dropped=_int_or_none(found.get("dropped")) or 0,
        in_steps_ns=_measured_in_steps(metadata or {}),
        cold_steps=stat("unrecorded", "cold") or 0,
        settled=settled,
        optimizers_in_turn=len(turn) if in_turn and isinstance(turn, list) else 0,
        edges=_int_or_none(edges.get("count")) or 0,
        edge_extra_ns=_int_or_none(edges.get("extra_ns")),
        edges_saving=_int_or_none(edges.get("saving")) or 0,
    )


def _measured_in_steps(metadata: Mapping[str, Any]) -> dict[str, int]:
    """The sampler's own time inside the window: sampling (``busy_ms``) and its signal
    handler (``handler_ms``), as its metadata states them."""
    sampler = metadata.get("stepscope_sampler")
    if not isinstance(sampler, Mapping):
        return {}
    spent = [
        v
        for v in (sampler.get(key) for key in ("busy_ms", "handler_ms"))
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    # a sampler that ran and took nothing inside the steps states its 0 ms
    return {"sampler": int(sum(spent) * 1e6)} if spent else {}


def pick_overhead(summaries: Sequence[TraceSummary]) -> Overhead | None:
    """The overhead of several files together: the one that saw the most steps (the last
    window of a run knows every step before it)."""
    known = [s.overhead for s in summaries if s.overhead is not None]
    if not known:
        return None
    return max(known, key=lambda o: o.recorded_steps + o.unrecorded_steps + o.warmup_steps)
