"""Self times never overlap, and stepscope's own frames never appear in with_stack results."""

from __future__ import annotations

import cProfile
import pstats
from pathlib import Path

import pytest

import stepscope
from stepscope.trace.model import TraceBuilder
from stepscope.trace.nesting import nest_spans

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native


class Packet:
    """A small object the scheduler moves around (a richards-like workload)."""

    def __init__(self, kind: int, payload: int) -> None:
        self.kind = kind
        self.payload = payload

    def weight(self) -> int:
        return self.payload * 3 + self.kind


class Scheduler:
    """Queues packets and runs handlers: many small method calls, like pyperformance's richards."""

    def __init__(self, size: int) -> None:
        self.queue = [Packet(i % 4, i) for i in range(size)]

    def handle(self, packet: Packet) -> int:
        return packet.weight() if packet.kind else -packet.weight()

    def run(self) -> int:
        total = 0
        for packet in self.queue:
            total += self.handle(packet)
        return total


def train(prof: stepscope.profile | None, steps: int) -> None:
    """The user's loop: one scheduler run per step."""
    for _ in range(steps):
        Scheduler(3000).run()
        if prof is not None:
            prof.step()


def _busy_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of (start, end) intervals."""
    busy, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start >= reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    return busy


def test_crossing_spans_share_time_without_overlap() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("outer", "python_function", 1, 1, 0, 100)
    b.span("call", "python_function", 1, 1, 10, 40)  # 10..50
    b.span("ProfilerStep#1", "user_annotation", 1, 1, 40, 40)  # 40..80 crosses it
    b.span("inner", "cpu_op", 1, 1, 60, 10)  # inside the step marker
    trace = b.build()
    nesting = nest_spans(trace)
    assert list(nesting.self_ns) == [30, 30, 30, 10]
    assert sum(nesting.self_ns) == 100  # the busy time of the track
    # the step outlives "call": it hangs under "outer", the innermost span containing it whole
    assert list(nesting.parent) == [-1, 0, 0, 2]


def test_nested_spans_keep_the_fast_answer() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("a", "cpu_op", 1, 1, 0, 100)
    b.span("b", "cpu_op", 1, 1, 10, 20)
    b.span("c", "cpu_op", 1, 1, 50, 50)  # ends exactly with its parent
    b.span("d", "cpu_op", 1, 2, 0, 30)
    nesting = nest_spans(b.build())
    assert list(nesting.self_ns) == [30, 20, 50, 30]


def test_with_stack_self_times_add_up_to_the_busy_window() -> None:
    with stepscope.profile(with_stack=True) as prof:
        train(prof, 3)
    trace = prof.trace()
    names = [trace.strings[n] for n in trace.spans["name"]]
    assert not [n for n in names if "stepscope/" in n or "stepscope\\" in n]
    table = prof.key_averages()
    self_total = sum(row.self_cpu_time_total_ns for row in table)
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    spans = trace.spans
    for s, d, p, t, c in zip(
        spans["start_ns"], spans["dur_ns"], spans["pid"], spans["tid"], spans["cat"], strict=True
    ):
        if trace.strings[c] != "Trace":  # Kineto's whole-session marker, left out of tables
            tracks.setdefault((p, t), []).append((s, s + d))
    window = trace.metadata["stepscope_window"]
    # every thread's busy time, counted once (other threads may run: export threads, ...)
    assert self_total == sum(_busy_ns(intervals) for intervals in tracks.values())
    main = max(tracks, key=lambda track: len(tracks[track]))
    assert _busy_ns(tracks[main]) <= window["end_ns"] - window["start_ns"]
    rows = {row.key: row for row in table}
    trainer = next(row for key, row in rows.items() if key.endswith(": train"))
    # The loop itself does next to nothing (its self time holds the loop and prof.step(), whose
    # own frames are not shown): a sliver of its total, not the half it used to be.
    assert trainer.self_cpu_time_total < 0.2 * trainer.cpu_time_total


def test_with_stack_call_counts_match_cprofile() -> None:
    with stepscope.profile(with_stack=True) as prof:
        train(prof, 2)
    counts = {row.key.rsplit(": ", 1)[-1]: row.count for row in prof.key_averages()}
    profiler = cProfile.Profile()
    profiler.runcall(train, None, 2)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    calls_by_function = {func: calls for (_, _, func), (calls, *_rest) in stats.items()}
    assert counts["Packet.weight"] == calls_by_function["weight"] == 2 * 3000
    assert counts["Scheduler.handle"] == calls_by_function["handle"]
    assert counts["Scheduler.run"] == calls_by_function["run"] == 2


def test_export_stacks_nest_the_step_under_the_users_frames(tmp_path: Path) -> None:
    with stepscope.profile(with_stack=True) as prof:
        train(prof, 2)
    out = tmp_path / "stacks.txt"
    prof.export_stacks(str(out))
    lines = out.read_text().splitlines()
    assert lines
    assert not [line for line in lines if "stepscope/" in line or "profile.step" in line]
    handle = [line for line in lines if line.rsplit(" ", 1)[0].endswith("Scheduler.handle")]
    assert handle
    for line in handle:
        frames = line.rsplit(" ", 1)[0].split(";")
        assert [f for f in frames if f.endswith(": train")]
        assert frames.index("ProfilerStep*") < len(frames) - 3
