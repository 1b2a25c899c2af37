"""``nest_spans`` sweeps only the stretches of a track that hold crossing spans: its self times
equal one sweep over each whole track (the definition), on random traces with crossings."""

from __future__ import annotations

import random
from array import array

import pytest

from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.nesting import _sweep_self_times, nest_spans


def random_trace(rng: random.Random, n: int) -> Trace:
    """Spans on two tracks: nested runs, crossing pairs, zero lengths, equal starts and gaps."""
    b = TraceBuilder()
    for tid in (1, 2):
        t = 0
        for _ in range(n):
            t += rng.choice((0, 0, 1, 5, 50))
            b.span(rng.choice("abc"), "cpu_op", 7, tid, t, rng.choice((0, 1, 3, 10, 40, 200)))
    return b.build()


def whole_track_sweep(trace: Trace) -> list[int]:
    """Self times from one sweep over every whole track (spans by start, then longest first)."""
    spans = trace.spans
    pid, tid = spans["pid"].tolist(), spans["tid"].tolist()
    start, dur = spans["start_ns"].tolist(), spans["dur_ns"].tolist()
    self_ns = array("q", dur)
    tracks: dict[tuple[int, int], list[int]] = {}
    for i in range(len(spans)):
        tracks.setdefault((pid[i], tid[i]), []).append(i)
    for members in tracks.values():
        members.sort(key=lambda i: (start[i], -dur[i], i))
        _sweep_self_times(members, start, dur, self_ns)
    return self_ns.tolist()


@pytest.mark.parametrize("seed", range(40))
def test_self_times_match_a_whole_track_sweep(seed: int) -> None:
    trace = random_trace(random.Random(seed), 60)
    assert nest_spans(trace).self_ns.tolist() == whole_track_sweep(trace)
