"""The C record_function and its pure-Python twin record the same spans."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stepscope._ext import native
from stepscope.collectors import annotations
from stepscope.collectors.base import WindowContext
from stepscope.trace import Span, TraceBuilder

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native

BACKENDS = ["python"] + (["native"] if native() is not None else [])


def record(kind: str, body: Any, max_spans: int = 0) -> tuple[list[Span], WindowContext]:
    if kind == "native":
        make: Any = native().RecordFunction  # type: ignore[union-attr]
        backend = annotations._NativeBackend(native())
    else:
        make = annotations.PyRecordFunction
        backend = annotations.python_backend
    collector = annotations.AnnotationCollector(max_spans=max_spans, backend=backend)
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


def workload(make: Any) -> None:
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


@pytest.mark.parametrize("kind", BACKENDS)
def test_backends_record_the_same_spans(kind: str) -> None:
    spans, ctx = record(kind, workload)
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


@pytest.mark.parametrize("kind", BACKENDS)
def test_budget_counts_dropped_spans(kind: str) -> None:
    def many(make: Any) -> None:
        for _ in range(10):
            with make("x"):
                pass

    spans, ctx = record(kind, many, max_spans=4)
    assert len(spans) == 4
    assert ctx.metadata["stepscope_annotations_dropped"] == 6
    assert ctx.summary == ["6 annotation spans dropped (max_spans=4)"]


@pytest.mark.parametrize("kind", BACKENDS)
def test_spans_entered_before_the_window_are_not_recorded(kind: str) -> None:
    make: Any = native().RecordFunction if kind == "native" else annotations.PyRecordFunction  # type: ignore[union-attr]
    early = make("early")
    early.__enter__()

    def body(m: Any) -> None:
        early.__exit__(None, None, None)
        with m("inside"):
            pass

    spans, _ = record(kind, body)
    assert [s.name for s in spans] == ["inside"]


def test_max_spans_is_validated() -> None:
    with pytest.raises(ValueError, match="max_spans"):
        annotations.AnnotationCollector(max_spans=-1)


@pytest.mark.parametrize("kind", BACKENDS)
def test_emit_span_adds_a_timed_span_only_while_recording(kind: str) -> None:
    backend = (
        annotations._NativeBackend(native()) if kind == "native" else annotations.python_backend
    )
    assert backend.emit("outside", None, 1, 2) is False

    def body(make: Any) -> None:
        assert backend.emit("checkpoint.save", {"checkpoint_id": "c1"}, 100, 250) is True

    spans, _ = record(kind, body)
    (span,) = spans
    assert (span.name, span.start_ns, span.dur_ns, span.args) == (
        "checkpoint.save",
        100,
        150,
        {"checkpoint_id": "c1"},
    )
    assert span.tid == threading.get_native_id()
