"""What the integration tests compute themselves from a written trace: the recorded step
numbers and each step's share of time inside regions chosen by name (an independent split)."""

from __future__ import annotations

from collections.abc import Callable

from stepscope.analysis.device import merge_intervals
from stepscope.trace.model import Trace


def step_spans(trace: Trace) -> list[tuple[int, int, int, int]]:
    """(step number, start, end, tid) of every ``ProfilerStep#N`` span, by number."""
    spans, strings = trace.spans, trace.strings
    found = []
    for i in range(len(spans)):
        name = strings[spans["name"][i]]
        if name.startswith("ProfilerStep#"):
            start = spans["start_ns"][i]
            found.append(
                (int(name.split("#")[1]), start, start + spans["dur_ns"][i], spans["tid"][i])
            )
    return sorted(found)


def region_shares(trace: Trace, chosen: Callable[[str], bool]) -> dict[int, float]:
    """Per step: the % of its time covered by spans whose name ``chosen`` accepts (their
    union, on the step's thread, cut at the step's edges)."""
    spans, strings = trace.spans, trace.strings
    names = [strings[n] for n in spans["name"]]
    shares = {}
    for step, lo, hi, tid in step_spans(trace):
        cut = [
            (max(lo, spans["start_ns"][i]), min(hi, spans["start_ns"][i] + spans["dur_ns"][i]))
            for i in range(len(spans))
            if spans["tid"][i] == tid and chosen(names[i])
        ]
        covered = sum(b - a for a, b in merge_intervals([c for c in cut if c[1] > c[0]]))
        shares[step] = 100.0 * covered / (hi - lo)
    return shares
