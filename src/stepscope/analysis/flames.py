"""The flame graphs' stacks of the analysed steps (``FlameStacks``): one trace's, and several
traces' summed.  Drawn from the nesting and the step windows the analysis already has, so a
renderer never finds steps or nests spans again."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stepscope.analysis.result import FlameStacks
from stepscope.trace.model import Trace
from stepscope.trace.nesting import Nesting
from stepscope.trace.stacks import collapsed_from_samples, span_stacks_ns

__all__ = ["merge_flames", "trace_flames"]


def trace_flames(
    trace: Trace,
    nesting: Nesting,
    members: Iterable[int],
    windows: Sequence[tuple[int, int]] | None,
) -> FlameStacks:
    """The stacks of the host spans ``members`` (by self time) and of the samples taken inside
    ``windows`` (``[start_ns, end_ns)``; None: every sample), idle threads left out."""
    spans = span_stacks_ns(trace, keep=set(members).__contains__, nesting=nesting)
    samples = (
        collapsed_from_samples(trace, include_idle=False, windows=windows)
        if len(trace.samples)
        else {}
    )
    return FlameStacks(spans, samples)


def _summed(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for stacks in parts:
        for key, value in stacks.items():
            total[key] = total.get(key, 0) + value
    return total


def merge_flames(parts: Sequence[FlameStacks | None]) -> FlameStacks | None:
    """Several traces' stacks summed (None unless every trace kept its stacks)."""
    if not parts or any(p is None for p in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    kept = [p for p in parts if p is not None]
    return FlameStacks(_summed(p.spans for p in kept), _summed(p.samples for p in kept))
