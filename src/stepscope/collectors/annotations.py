"""User annotations: ``record_function`` / ``traced`` spans, and the collector that gathers them.

Outside a recording window a ``record_function`` block only checks one flag.  Inside a window,
each completed block becomes a tuple ``(name, args, start_ns, end_ns, thread_id)`` appended to
the window's list; the collector turns those into ``user_annotation`` spans.  The C type
(``stepscope._native.RecordFunction``) and the pure-Python twin below behave the same.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast, overload

from stepscope import clock
from stepscope._ext import NativeModule, native
from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.compiled import register_with_dynamo
from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import OWN_WORK_FRAME

STEP_SPAN = "ProfilerStep#"
"""Spans named so (the profile's steps, one per step) are kept over ``max_spans``."""


def kept_over_budget(name: str) -> bool:
    """Whether a span is kept over ``max_spans``: a step (without it no step is known), or
    stepscope's own work between steps (without it that time is the self time of a hook)."""
    return name.startswith(STEP_SPAN) or name == OWN_WORK_FRAME


if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "AnnotationCollector",
    "PyRecordFunction",
    "RecordFunctionType",
    "emit_span",
    "is_recording",
    "record_function",
    "traced",
]

F = TypeVar("F", bound=Callable[..., Any])
OPEN_FLAG = "stepscope.open_at_window_end"
SpanTuple = tuple[str, Any, int, int, int]


Bridge = tuple[Callable[[str, Any], Any], Callable[[Any], Any]]
"""Another profiler's span per block: ``enter(name, args) -> handle`` and ``exit(handle)``."""


class _Backend(Protocol):
    def start(self, sink: list[SpanTuple], max_spans: int) -> None: ...
    def stop(self) -> tuple[int, int]: ...
    def recording(self) -> bool: ...
    def set_bridge(self, bridge: Bridge | None) -> int: ...
    def emit(self, name: str, args: Any, start_ns: int, end_ns: int) -> bool: ...


class RecordFunctionType(Protocol):
    """The class ``record_function`` is: the C ``stepscope._native.RecordFunction`` or its twin
    :class:`PyRecordFunction` (the same constructor, context manager and decorator)."""

    def __init__(self, name: str, args: Any = None) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def args(self) -> Any: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> Literal[False]: ...
    def __call__(self, fn: F, /) -> F: ...


class _PythonBackend:
    """Window state for the pure-Python twin."""

    def __init__(self) -> None:
        self.active = False
        self.generation = 0
        self.sink: list[SpanTuple] | None = None
        self.max_spans = 0
        self.dropped = 0
        self.open: dict[int, PyRecordFunction] = {}
        self.bridge: Bridge | None = None
        self.bridge_errors = 0

    def set_bridge(self, bridge: Bridge | None) -> int:
        self.bridge = bridge
        errors, self.bridge_errors = self.bridge_errors, 0
        return errors

    def emit(self, name: str, args: Any, start_ns: int, end_ns: int) -> bool:
        if not self.active:
            return False
        self.append((name, args, start_ns, end_ns, threading.get_native_id()))
        return True

    def bridge_failed(self) -> None:
        self.bridge_errors += 1
        self.bridge = None

    def start(self, sink: list[SpanTuple], max_spans: int) -> None:
        if self.active:
            raise RuntimeError("annotations are already recording a window")
        self.sink, self.max_spans, self.dropped = sink, max_spans, 0
        self.generation += 1
        self.active = True

    def append(self, span: SpanTuple) -> None:
        sink = self.sink
        if sink is None:
            return
        if self.max_spans and len(sink) >= self.max_spans and not kept_over_budget(span[0]):
            self.dropped += 1
        else:
            sink.append(span)

    def stop(self) -> tuple[int, int]:
        if not self.active:
            return 0, 0
        end = clock.now_ns()
        closed = 0
        for rf in list(self.open.values()):
            if rf._generation == self.generation:
                args = dict(rf.args) if isinstance(rf.args, Mapping) else {}
                args[OPEN_FLAG] = True
                self.append((rf.name, args, rf._start, end, rf._tid))
                closed += 1
            rf._open = False
        self.open.clear()
        self.active = False
        self.sink = None
        return closed, self.dropped

    def recording(self) -> bool:
        return self.active


_python_backend = _PythonBackend()


class PyRecordFunction:
    """Pure-Python twin of the C ``record_function``."""

    __slots__ = ("_bridge_handle", "_generation", "_open", "_start", "_tid", "args", "name")

    def __init__(self, name: str, args: Any = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"record_function name must be a str, got {type(name).__name__}")
        self.name = name
        self.args = args
        self._open = False
        self._start = 0
        self._generation = 0
        self._tid = 0
        self._bridge_handle: Any = None

    def __new__(cls, name: str, args: Any = None) -> PyRecordFunction:
        # A __new__ of its own, for torch.compile to substitute (collectors/compiled.py).
        return object.__new__(cls)

    def __enter__(self) -> PyRecordFunction:
        backend = _python_backend
        if backend.active and not self._open:
            self._start = clock.now_ns()
            self._generation = backend.generation
            self._tid = threading.get_native_id()
            self._open = True
            backend.open[id(self)] = self
        # Another profiler records (torch's, see collectors/torch.py): open its
        # record_function too, whether or not a stepscope window records.
        if backend.bridge is not None and self._bridge_handle is None:
            try:
                self._bridge_handle = backend.bridge[0](self.name, self.args)
            except Exception:
                backend.bridge_failed()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        handle, self._bridge_handle = self._bridge_handle, None
        if handle is not None and _python_backend.bridge is not None:
            try:
                _python_backend.bridge[1](handle)
            except Exception:
                _python_backend.bridge_failed()
        if self._open:
            end = clock.now_ns()
            self._open = False
            backend = _python_backend
            backend.open.pop(id(self), None)
            if backend.active and self._generation == backend.generation:
                backend.append((self.name, self.args, self._start, end, self._tid))
        return False

    def __call__(self, fn: F) -> F:
        return _decorate(self.name, self.args, fn)


class _NativeBackend:
    """Window state held by the C extension."""

    def __init__(self, mod: NativeModule) -> None:
        self._mod = mod

    def start(self, sink: list[SpanTuple], max_spans: int) -> None:
        self._mod._annotations_start(sink, max_spans)

    def stop(self) -> tuple[int, int]:
        return self._mod._annotations_stop()

    def recording(self) -> bool:
        return self._mod._annotations_recording()

    def emit(self, name: str, args: Any, start_ns: int, end_ns: int) -> bool:
        return self._mod._annotations_emit(name, args, start_ns, end_ns)

    def set_bridge(self, bridge: Bridge | None) -> int:
        enter, exit_ = bridge if bridge is not None else (None, None)
        return self._mod._annotations_set_bridge(enter, exit_)


def _decorate(name: str, args: Any, fn: F) -> F:
    """Wrap ``fn`` so each call (or iteration, for generators) is one span."""
    if not callable(fn):
        raise TypeError(f"record_function can only decorate a callable, got {fn!r}")
    make = record_function
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*a: Any, **kw: Any) -> Any:
            with make(name, args):
                return await fn(*a, **kw)

        return cast(F, async_wrapper)
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*a: Any, **kw: Any) -> Any:
            with make(name, args):
                return (yield from fn(*a, **kw))

        return cast(F, gen_wrapper)

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        with make(name, args):
            return fn(*a, **kw)

    return cast(F, wrapper)


record_function: type[RecordFunctionType]
"""``record_function(name, args=None)``: the C class when the extension runs, else its twin."""
_native_mod = native()
if _native_mod is not None:
    _native_mod._annotations_set_decorator(_decorate)
    record_function = _native_mod.RecordFunction
    default_backend: _Backend = _NativeBackend(_native_mod)
else:
    record_function = PyRecordFunction
    default_backend = _python_backend
python_backend: _Backend = _python_backend
register_with_dynamo(record_function, PyRecordFunction)


def is_recording() -> bool:
    """Whether a profiler window is recording annotations now."""
    return default_backend.recording()


def emit_span(name: str, start_ns: int, end_ns: int, args: Mapping[str, Any] | None = None) -> bool:
    """Add an already-timed span (stepscope clock ns) to the recording window, on this thread.

    Returns False (and records nothing) when no window is recording.
    """
    if not isinstance(name, str):
        raise TypeError(f"span name must be a str, got {type(name).__name__}")
    return default_backend.emit(name, args, start_ns, end_ns)


@overload
def traced(fn: F, *, name: str | None = None) -> F: ...
@overload
def traced(fn: None = None, *, name: str | None = None) -> Callable[[F], F]: ...
def traced(fn: F | None = None, *, name: str | None = None) -> F | Callable[[F], F]:
    """Decorator: each call of the function is a span named after its qualified name."""

    def apply(f: F) -> F:
        label = name or f"{f.__module__}.{f.__qualname__}"
        return _decorate(label, None, f)

    if fn is None:
        return apply
    return apply(fn)


def _span_args(args: Any, record_shapes: bool = False) -> Mapping[str, Any] | None:
    """A block's args as span args: a mapping's items (keyword inputs), or the args string.

    torch records ``record_function``'s args string as the block's one input: with
    ``record_shapes`` its shapes, strides, type and value are there, each empty (the string
    itself is not); stepscope writes the same beside the string.
    """
    if args is None:
        return None
    if isinstance(args, Mapping):
        return {str(k): v for k, v in args.items()}
    text = {"args": args if isinstance(args, str) else repr(args)}
    if record_shapes:
        text.update(string_input())
    return text


def string_input() -> dict[str, Any]:
    """The args torch writes for a ``record_function`` given an args string (record_shapes)."""
    return {"Input Dims": [[]], "Input Strides": [[]], "Input type": [""], "Concrete Inputs": [""]}


class AnnotationCollector(Collector):
    """Collects ``record_function`` spans (category ``user_annotation``) from every thread."""

    name = "annotations"
    collects_off_loop = True

    def __init__(
        self,
        max_spans: int = 2_000_000,
        backend: _Backend | None = None,
        *,
        record_shapes: bool = False,
    ) -> None:
        """``record_shapes``: a block's args string is written as torch's one string input."""
        if (
            isinstance(max_spans, bool)
            or not isinstance(max_spans, int)
            or not 0 <= max_spans < 2**62
        ):
            raise ValueError(
                f"max_spans must be an int in [0, 2**62) (0 = no limit), got {max_spans}"
            )
        self.max_spans = max_spans
        self.backend = backend or default_backend
        self.record_shapes = record_shapes
        self._sink: list[SpanTuple] = []
        self._recording = False

    def start(self, ctx: WindowContext) -> None:
        """Begin recording annotation spans."""
        self._sink = []
        self.backend.start(self._sink, self.max_spans)
        self._recording = True

    def stop(self, ctx: WindowContext) -> None:
        """Stop recording; spans still open are closed at the window end (flagged in args)."""
        if not self._recording:
            return
        self._recording = False
        closed, dropped = self.backend.stop()
        ctx.held[id(self)], self._sink = self._sink, []
        if closed:
            ctx.metadata["stepscope_annotations_open_at_end"] = closed
        if dropped:
            ctx.metadata["stepscope_annotations_dropped"] = dropped
            ctx.summary.append(f"{dropped} annotation spans dropped (max_spans={self.max_spans})")

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Append the window's spans to the trace."""
        pid = ctx.pid
        span = builder.span
        shapes = self.record_shapes
        spans: list[SpanTuple] = ctx.held.pop(id(self), [])
        for name, args, start, end, tid in spans:
            span(name, "user_annotation", pid, tid, start, end - start, _span_args(args, shapes))

    def close(self) -> None:
        """Stop recording if a window is still open."""
        if self._recording:
            self._recording = False
            self.backend.stop()

    def after_fork_in_child(self) -> None:
        """Close the parent's annotation window in a forked child (its spans are the parent's)."""
        self.close()
        self._sink = []
