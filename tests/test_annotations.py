"""The C record_function and its pure-Python twin record the same spans."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from stepscope._ext import resolve
from stepscope.collectors import annotations as ann
from stepscope.collectors.base import WindowContext
from stepscope.trace import Span, TraceBuilder

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native

if TYPE_CHECKING:
    from typing import TypeAlias

    from stepscope._native import RecordFunction

    RecordFunctionType: TypeAlias = type[ann.PyRecordFunction] | type[RecordFunction]


def record_function_of(implementation: str) -> RecordFunctionType:
    """The ``record_function`` class of one implementation."""
    mod = resolve(implementation)
    return ann.PyRecordFunction if mod is None else mod.RecordFunction


def backend_of(implementation: str) -> ann._Backend:
    """The annotation window state of one implementation."""
    mod = resolve(implementation)
    return ann.python_backend if mod is None else ann._NativeBackend(mod)


def record(
    implementation: str, body: Callable[[RecordFunctionType], None], max_spans: int = 0
) -> tuple[list[Span], WindowContext]:
    make = record_function_of(implementation)
    backend = backend_of(implementation)
    collector = ann.AnnotationCollector(max_spans=max_spans, backend=backend)
    ctx = WindowContext(window=0)
    collector.start(ctx)
    try:
        body(make)
    finally:
        collector.stop(ctx)
    builder = TraceBuilder(base_time_ns=0)
    collector.collect(builder, ctx)
    return list(builder.build().iter_spans()), ctx


def shape(spans: list[Span]) -> list[tuple[str, Any]]:
    return sorted((s.name, s.args) for s in spans)


def workload(make: RecordFunctionType) -> None:
    with make("outer", {"k": "v"}):
        with make("inner"):
            pass
        try:
            with make("raises"):
                raise ValueError("x")
        except ValueError:
            pass
        t = threading.Thread(target=lambda: make("thread").__enter__().__exit__(None, None, None))
        t.start()
        t.join()
        with make("torch-style", "a string arg"):
            pass
    dangling = make("dangling")
    dangling.__enter__()


def test_backends_record_the_same_spans(implementation: str) -> None:
    spans, ctx = record(implementation, workload)
    assert shape(spans) == [
        ("dangling", {"stepscope.open_at_window_end": True}),
        ("inner", None),
        ("outer", {"k": "v"}),
        ("raises", None),
        ("thread", None),
        ("torch-style", {"args": "a string arg"}),
    ]
    by_name = {s.name: s for s in spans}
    outer = by_name["outer"]
    for child in ("inner", "raises"):
        assert outer.start_ns <= by_name[child].start_ns <= by_name[child].end_ns <= outer.end_ns
    assert by_name["thread"].tid != outer.tid
    assert {s.cat for s in spans} == {"user_annotation"}
    assert ctx.metadata["stepscope_annotations_open_at_end"] == 1


def test_budget_counts_dropped_spans(implementation: str) -> None:
    def many(make: RecordFunctionType) -> None:
        for _ in range(10):
            with make("x"):
                pass

    spans, ctx = record(implementation, many, max_spans=4)
    assert len(spans) == 4
    assert ctx.metadata["stepscope_annotations_dropped"] == 6
    assert ctx.summary == ["6 annotation spans dropped (max_spans=4)"]


def test_spans_entered_before_the_window_are_not_recorded(implementation: str) -> None:
    early = record_function_of(implementation)("early")
    early.__enter__()

    def body(m: RecordFunctionType) -> None:
        early.__exit__(None, None, None)
        with m("inside"):
            pass

    spans, _ = record(implementation, body)
    assert [s.name for s in spans] == ["inside"]


def test_max_spans_is_validated() -> None:
    with pytest.raises(ValueError, match="max_spans"):
        ann.AnnotationCollector(max_spans=-1)


def test_emit_span_adds_a_timed_span_only_while_recording(implementation: str) -> None:
    backend = backend_of(implementation)
    assert backend.emit("outside", None, 1, 2) is False

    def body(make: RecordFunctionType) -> None:
        assert backend.emit("checkpoint.save", {"checkpoint_id": "c1"}, 100, 250) is True

    spans, _ = record(implementation, body)
    (span,) = spans
    assert (span.name, span.start_ns, span.dur_ns, span.args) == (
        "checkpoint.save",
        100,
        150,
        {"checkpoint_id": "c1"},
    )
    assert span.tid == threading.get_native_id()


def test_step_spans_are_kept_when_the_budget_is_full(implementation: str) -> None:
    def steps_with_work(make: RecordFunctionType) -> None:
        for step in range(4):
            with make(f"ProfilerStep#{step}"):
                for _ in range(10):
                    with make("work"):
                        pass

    spans, ctx = record(implementation, steps_with_work, max_spans=5)
    names = [s.name for s in spans]
    # the steps close last, after the budget filled: all four are kept, only "work" is dropped
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
        f"ProfilerStep#{i}" for i in range(4)
    ]
    assert ctx.metadata["stepscope_annotations_dropped"] == 40 - names.count("work")


def test_a_report_shows_the_steps_and_the_drops_of_a_full_budget(tmp_path: Path) -> None:
    from stepscope import profile, schedule, trace_handler
    from stepscope.analysis.analyze import analyze
    from stepscope.trace import read_chrome_trace

    with profile(
        schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=trace_handler(str(tmp_path)),
        max_annotation_spans=5,
        torch_ops=False,
    ) as prof:
        prof.step()  # the warmup step
        for _ in range(3):
            for _ in range(10):
                with ann.record_function("work"):
                    pass
            prof.step()
    [path] = tmp_path.glob("*.json")
    trace = read_chrome_trace(path)
    kept = sum(1 for s in trace.iter_spans() if s.name == "work")
    summary = analyze([(path.name, trace)]).combined
    assert summary.has_steps and [s.step for s in summary.steps] == [1, 2, 3]
    assert summary.dropped["annotation_spans_dropped"] == 30 - kept
